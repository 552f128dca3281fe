// ctxapp dashboard: the little glue htmx's websocket extension does not do by itself.
// On every (re)connect, tell the server which message the page shows last, so it re-renders
// the live panels and sends only the messages this page has not seen (no gaps, no duplicates).
(function () {
  "use strict";
  function lastSeq() {
    var first = document.querySelector("#message-list [data-seq]");
    return first ? parseInt(first.getAttribute("data-seq"), 10) : 0;
  }
  function setStatus(text, cls) {
    var el = document.getElementById("live-status");
    if (!el) return;
    el.className = "live-status " + cls;
    el.querySelector(".live-text").textContent = text;
  }
  document.addEventListener("htmx:wsOpen", function (evt) {
    setStatus("live", "on");
    evt.detail.socketWrapper.send(JSON.stringify({ hello: { last_seq: lastSeq() } }));
  });
  document.addEventListener("htmx:wsClose", function () { setStatus("reconnecting", "off"); });
  document.addEventListener("htmx:wsAfterMessage", function () {
    var empty = document.getElementById("messages-empty");
    if (empty && document.querySelector("#message-list [data-seq]")) empty.remove();
  });
  // A <select data-autosubmit> submits its form when changed (no inline handlers: the
  // Content-Security-Policy allows scripts from our static files only).
  document.addEventListener("change", function (evt) {
    var target = evt.target;
    if (target && target.matches && target.matches("select[data-autosubmit]") && target.form) {
      target.form.submit();
    }
  });
  document.addEventListener("DOMContentLoaded", function () {
    if (!document.querySelector("[ws-connect]")) setStatus("static page", "idle");
  });
})();
