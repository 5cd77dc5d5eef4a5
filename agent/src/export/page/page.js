// drainwatch deploy page: re-render in place when the agent's data changes.
(function () {
  function every() { return Number(document.body.dataset.refresh) || 10000; }
  async function poll() {
    try {
      if (!document.hidden) {
        const r = await fetch(location.href, { cache: "no-store" });
        const doc = new DOMParser().parseFromString(await r.text(), "text/html");
        if (doc.body.dataset.state && doc.body.dataset.state !== document.body.dataset.state) {
          const open = new Map();
          for (const d of document.querySelectorAll("details[data-key]")) open.set(d.dataset.key, d.open);
          for (const d of doc.querySelectorAll("details[data-key]")) {
            if (open.has(d.dataset.key)) d.open = open.get(d.dataset.key);
          }
          document.getElementById("main").replaceWith(doc.getElementById("main"));
          document.body.dataset.state = doc.body.dataset.state;
          document.body.dataset.refresh = doc.body.dataset.refresh;
        }
        const u = doc.getElementById("updated");
        if (u) document.getElementById("updated").textContent = u.textContent;
      }
    } catch (e) { /* the agent restarts or the port-forward dropped: try again later */ }
    setTimeout(poll, every());
  }
  setTimeout(poll, every());
})();
