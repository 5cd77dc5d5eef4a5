#!/usr/bin/env python3
"""Writes drainwatch.json from a container runtime's default profile (containers/common's
seccomp.json format: rules conditioned on capabilities and architectures).

    python3 deploy/seccomp/derive.py /usr/share/containers/seccomp.json deploy/seccomp/drainwatch.json

The result is flat, for exactly the DaemonSet's capabilities and for amd64 and arm64: containerd
reads a Localhost profile as the OCI runtime spec's seccomp object and would ignore `includes`
and `excludes`, applying every conditional rule. Where the default both allows a call and
denies it with EPERM (setns without CAP_SYS_ADMIN), the denial stays. Then one rule allows what
the agent needs beyond the default: bpf() and perf_event_open() (deploy/README.md, Seccomp).
"""
import json
import sys

# deploy/kubernetes/drainwatch.yaml: drop ALL, add these.
CAPS = {"CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"}
ARCHES = {"amd64", "arm64"}
AGENT = ["bpf", "perf_event_open"]


def applies(rule):
    inc, exc = rule.get("includes") or {}, rule.get("excludes") or {}
    if set(inc.get("caps") or []) - CAPS or set(exc.get("caps") or []) & CAPS:
        return False
    if inc.get("arches") and not set(inc["arches"]) & ARCHES:
        return False
    assert not exc.get("arches"), rule
    return True


def main(src_path, out_path):
    src = json.load(open(src_path))
    allow, rules = set(), []
    for rule in filter(applies, src["syscalls"]):
        names = [n for n in rule["names"] if n not in AGENT]
        if not names:
            continue
        if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args"):
            allow.update(names)
            continue
        flat = {"names": names, "action": rule["action"]}
        if rule.get("errnoRet") is not None:
            flat["errnoRet"] = rule["errnoRet"]
        if rule.get("args"):
            flat["args"] = rule["args"]
        if flat not in rules:
            rules.append(flat)
    for rule in rules:
        if rule["action"] == "SCMP_ACT_ERRNO" and not rule.get("args"):
            allow -= set(rule["names"])
    rules.sort(key=lambda r: r["action"] != "SCMP_ACT_ALLOW")
    out = {
        "defaultAction": src["defaultAction"],
        "defaultErrnoRet": src["defaultErrnoRet"],
        "syscalls": [{"names": sorted(allow), "action": "SCMP_ACT_ALLOW"}]
        + rules
        + [{"names": AGENT, "action": "SCMP_ACT_ALLOW"}],
    }
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
