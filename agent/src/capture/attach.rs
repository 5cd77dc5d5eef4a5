//! Attaching one plan entry: a classic tracepoint, BTF tracepoints, kprobes. Each returns
//! the error text the plan records for a hook that could not attach.

use std::collections::BTreeMap;

use aya::{
    Ebpf,
    programs::{BtfTracePoint, KProbe, TracePoint},
};

use super::{Resolution, TracepointInfo, plan::Hook};

pub(super) fn attach_tracepoint(
    ebpf: &mut Ebpf,
    links: &mut Vec<Box<dyn Send>>,
    infos: &BTreeMap<&'static str, TracepointInfo>,
    res: &Resolution,
    hook: &Hook,
) -> Result<Vec<String>, String> {
    let Hook::Tracepoint {
        category,
        name,
        program,
        also,
        needs,
        ..
    } = *hook
    else {
        return Err("not a tracepoint".into());
    };
    let info = infos
        .get(name)
        .ok_or_else(|| "no decoder for this tracepoint".to_string())?;
    let fmt = info.format.as_ref().map_err(Clone::clone)?;
    let missing_needed: Vec<_> = needs.iter().filter(|f| fmt.field(f).is_none()).collect();
    if !missing_needed.is_empty() {
        return Err(format!("format lacks {missing_needed:?}"));
    }
    if let Some(missing) = res.missing_required.get(name).filter(|m| !m.is_empty()) {
        return Err(format!("format lacks required fields {missing:?}"));
    }
    let prog: &mut TracePoint = program_of(ebpf, program)?;
    if prog.fd().is_err() {
        prog.load().map_err(|e| format!("load: {e}"))?;
    }
    // All targets or none: a partial set would silently miss events.
    let mut attached: Vec<Box<dyn Send>> = Vec::new();
    for target in std::iter::once(name).chain(also.iter().copied()) {
        let id = prog
            .attach(category, target)
            .map_err(|e| format!("attach {target}: {}", chain(&e)))?;
        attached.push(Box::new(prog.take_link(id).map_err(|e| format!("{e}"))?));
    }
    links.extend(attached);
    Ok(res.missing_optional.get(name).cloned().unwrap_or_default())
}

/// Whether the classic tracepoint `name`'s format gave what a tp_btf program takes from it
/// (`Hook::BtfTracepoint::needs`).
pub(super) fn format_provides(
    infos: &BTreeMap<&'static str, TracepointInfo>,
    res: &Resolution,
    name: &str,
    needs: &[&str],
) -> Result<(), String> {
    if needs.is_empty() {
        return Ok(());
    }
    let info = infos
        .get(name)
        .ok_or_else(|| format!("no format for {name}"))?;
    info.format.as_ref().map_err(Clone::clone)?;
    let lacking: Vec<_> = needs
        .iter()
        .filter(|n| {
            res.missing_required
                .get(name)
                .is_some_and(|m| m.iter().any(|x| x == *n))
        })
        .collect();
    if lacking.is_empty() {
        Ok(())
    } else {
        Err(format!("format lacks {lacking:?}"))
    }
}

/// Every (tracepoint, program) pair, or none: links taken so far are dropped (detached) if a
/// later one fails.
pub(super) fn attach_btf_tracepoints<'a>(
    ebpf: &mut Ebpf,
    links: &mut Vec<Box<dyn Send>>,
    (btf_path, btf): (&str, &mut Option<aya::Btf>),
    pairs: impl Iterator<Item = (&'a str, &'a str)>,
    offsets: &[&str],
    missing_members: &[String],
) -> Result<(), String> {
    let lacking: Vec<_> = offsets
        .iter()
        .filter(|o| missing_members.iter().any(|m| m == *o))
        .collect();
    if !lacking.is_empty() {
        return Err(format!("BTF lacks {lacking:?}"));
    }
    let mut attached = Vec::new();
    for (name, program) in pairs {
        attach_btf_tracepoint(ebpf, &mut attached, (btf_path, btf), (name, program))
            .map_err(|e| format!("{name}: {e}"))?;
    }
    links.extend(attached);
    Ok(())
}

fn attach_btf_tracepoint(
    ebpf: &mut Ebpf,
    links: &mut Vec<Box<dyn Send>>,
    (btf_path, btf): (&str, &mut Option<aya::Btf>),
    (name, program): (&str, &str),
) -> Result<(), String> {
    let prog: &mut BtfTracePoint = program_of(ebpf, program)?;
    if prog.fd().is_err() {
        // aya resolves the tracepoint's BTF type itself.
        let btf = match btf {
            Some(b) => b,
            None => btf.insert(
                aya::Btf::parse_file(btf_path, aya::Endianness::default())
                    .map_err(|e| format!("BTF: {e}"))?,
            ),
        };
        prog.load(name, btf)
            .map_err(|e| format!("load: {}", chain(&e)))?;
    }
    let id = prog
        .attach()
        .map_err(|e| format!("attach: {}", chain(&e)))?;
    links.push(Box::new(prog.take_link(id).map_err(|e| format!("{e}"))?));
    Ok(())
}

pub(super) fn attach_kprobes(
    ebpf: &mut Ebpf,
    links: &mut Vec<Box<dyn Send>>,
    functions: &[(&str, &str)],
) -> Result<(), String> {
    // All or nothing: a partial set would silently miss some resets. Links taken so far are
    // dropped (detached) if a later function fails.
    let mut attached: Vec<Box<dyn Send>> = Vec::new();
    for (function, program) in functions {
        let step = (|| {
            let prog: &mut KProbe = program_of(ebpf, program)?;
            if prog.fd().is_err() {
                prog.load().map_err(|e| format!("load: {e}"))?;
            }
            let id = prog
                .attach(function, 0)
                .map_err(|e| format!("attach {function}: {}", chain(&e)))?;
            prog.take_link(id).map_err(|e| format!("{e}"))
        })();
        attached.push(Box::new(step?));
    }
    links.extend(attached);
    Ok(())
}

/// The object's program `name` as its kind `P`.
fn program_of<'a, P>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut P, String>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| format!("program {name} missing from the eBPF object"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())
}

/// An error with its causes, `a: b: c`: aya's messages alone often omit the OS error.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cur = c.source();
    }
    out
}
