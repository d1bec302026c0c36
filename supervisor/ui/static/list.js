// The list of tasks and the runners page keep themselves current: every few seconds, while
// the page is visible, the part marked data-fragment is fetched again and put in place. A
// failed fetch leaves the page as it is. The copy buttons put a whole id on the clipboard.
(function () {
  "use strict";
  var EVERY_MS = 5000;

  function live() { return document.querySelector("[data-fragment]"); }

  function refresh() {
    var current = live();
    if (!current || document.hidden || !window.fetch) { return; }
    fetch(current.dataset.fragment, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (text === null) { return; }
        var box = document.createElement("div");
        box.innerHTML = text;
        var next = box.querySelector("[data-fragment]");
        var now = live();
        if (next && now) { now.replaceWith(next); }
      })
      .catch(function () {});
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("button.copy") : null;
    if (!button || !navigator.clipboard) { return; }
    navigator.clipboard.writeText(button.dataset.copy).then(function () {
      button.textContent = "copied";
      setTimeout(function () { button.textContent = "copy"; }, 1500);
    }, function () {});
  });
  window.setInterval(refresh, EVERY_MS);
})();
