// sluice review: the only script. It keeps the pending queue live: when the
// server-sent event stream says a hold changed, it fetches the server-rendered
// list again (all escaping happens on the server) and swaps it in.
"use strict";
(function () {
  var q = document.getElementById("queue");
  if (!q || !window.EventSource) return;
  var live = document.getElementById("live");
  var busy = false, again = false;
  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(q.dataset.src, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (r.status === 401) { window.location = "/login"; return null; }
        return r.ok ? r.text() : null;
      })
      .then(function (html) {
        if (html === null) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        q.replaceChildren.apply(q, Array.prototype.slice.call(doc.body.childNodes));
      })
      .catch(function () {})
      .finally(function () { busy = false; if (again) { again = false; refresh(); } });
  }
  var es = new EventSource(q.dataset.live);
  es.addEventListener("open", function () { if (live) live.classList.add("on"); });
  es.addEventListener("error", function () { if (live) live.classList.remove("on"); });
  es.addEventListener("changed", refresh);
})();
