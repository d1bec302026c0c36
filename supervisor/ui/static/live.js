// Follows the task's event journal (server-sent events) and refetches the part of the page
// that changed. It applies only an event whose seq is above the highest it applied, and never
// puts back an older fragment than the one shown: the page does not go back in time.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.EventSource || !window.fetch) { return; }
  var applied = Number(live.dataset.seq) || 0;
  var source = new EventSource(live.dataset.events + "?after=" + applied);
  var fetching = false, again = false;

  function refresh() {
    if (fetching) { again = true; return; }
    fetching = true;
    fetch(live.dataset.fragment, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (text === null) { return; }
        var box = document.createElement("div");
        box.innerHTML = text;
        var fresh = box.querySelector("#live");
        if (fresh && Number(fresh.dataset.seq) >= Number(live.dataset.seq)) {
          live.replaceWith(fresh);
          live = fresh;
        }
      })
      .catch(function () {})
      .then(function () {
        fetching = false;
        if (again) { again = false; refresh(); }
      });
  }

  source.onmessage = function (event) {
    var seq = Number(event.lastEventId);
    if (!(seq > applied)) { return; }
    applied = seq;
    refresh();
  };
})();
