// Follows the task's event journal (server-sent events) and refetches the part of the page
// that changed. It applies only an event whose seq is above the highest it applied, and never
// puts back an older fragment than the one shown: the page does not go back in time. The
// actions are replaced only when the task's state changed, so a form being filled in stays.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.EventSource || !window.fetch) { return; }
  var applied = Number(live.dataset.seq) || 0;
  var source = new EventSource(live.dataset.events + "?after=" + applied);
  var fetching = false, again = false;

  function swap(fresh) {
    var box = document.createElement("div");
    box.innerHTML = fresh;
    var next = box.querySelector("#live");
    if (!next || Number(next.dataset.seq) < Number(live.dataset.seq)) { return; }
    live.replaceWith(next);
    live = next;
    var actions = document.getElementById("actions");
    var nextActions = box.querySelector("#actions");
    if (actions && nextActions && actions.dataset.state !== nextActions.dataset.state) {
      actions.replaceWith(nextActions);
    }
  }

  function refresh() {
    if (fetching) { again = true; return; }
    fetching = true;
    fetch(live.dataset.fragment, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) { if (text !== null) { swap(text); } })
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
