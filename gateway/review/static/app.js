// sluice review: the only script. It keeps the pending queue live: when the
// server-sent event stream says a hold changed, it fetches the server-rendered
// list again (all escaping happens on the server) and swaps it in. And it
// adds the viewer's local time beside every UTC time the server wrote.
"use strict";
(function () {
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  // localTimes appends "(… your time, ZONE UTC±hh:mm)" to each <time
  // class="ts">; the UTC text the server wrote stays as it is.
  function localTimes(root) {
    var zone = "";
    try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (e) {}
    root.querySelectorAll("time.ts").forEach(function (el) {
      if (el.querySelector(".local")) return;
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d.getTime())) return;
      var off = -d.getTimezoneOffset(), sign = off < 0 ? "-" : "+";
      off = Math.abs(off);
      var s = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
        pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
      var span = document.createElement("span");
      span.className = "local";
      span.textContent = off === 0 ? " (your time too)" :
        " (" + s + " your time, " + (zone ? zone + " " : "") + "UTC" + sign + pad(Math.floor(off / 60)) + ":" + pad(off % 60) + ")";
      el.appendChild(span);
    });
  }
  localTimes(document);

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
        localTimes(q);
      })
      .catch(function () {})
      .finally(function () { busy = false; if (again) { again = false; refresh(); } });
  }
  var es = new EventSource(q.dataset.live);
  es.addEventListener("open", function () { if (live) live.classList.add("on"); });
  es.addEventListener("error", function () { if (live) live.classList.remove("on"); });
  es.addEventListener("changed", refresh);
})();
