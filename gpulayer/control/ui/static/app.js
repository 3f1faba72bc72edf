// gpulayer dashboard: keeps the page's live section fresh and streams a job's log lines.
// Loaded from this server only (the Content-Security-Policy allows no other script).
"use strict";

(function () {
  var POLL_MS = 1500;
  var status = document.getElementById("live-status");

  function say(text) {
    if (status) { status.textContent = text; }
  }

  function poll(section) {
    var url = section.getAttribute("data-poll");
    var last = null;
    var busy = false;
    function tick() {
      if (busy || document.hidden) { return; }
      busy = true;
      fetch(url, { headers: { "Accept": "application/json" }, credentials: "same-origin" })
        .then(function (response) {
          if (response.status === 401) { window.location.assign("/ui/login"); return null; }
          return response.json();
        })
        .then(function (data) {
          if (!data) { return; }
          if (typeof data.html === "string" && data.html !== last) {
            last = data.html;
            section.innerHTML = data.html;
          }
          say("updated " + new Date().toLocaleTimeString());
        })
        .catch(function () { say("cannot reach the control plane; retrying"); })
        .then(function () { busy = false; });
    }
    window.setInterval(tick, POLL_MS);
  }

  function stream(pre) {
    var source = new EventSource(pre.getAttribute("data-stream"));
    source.onmessage = function (event) {
      var line = JSON.parse(event.data);
      var span = document.createElement("span");
      span.className = "line stream-" + line.stream;
      span.textContent = line.text.replace(/\n$/, "") + "\n";
      var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.appendChild(span);
      if (atBottom) { pre.scrollTop = pre.scrollHeight; }
    };
    source.addEventListener("end", function () { source.close(); pre.classList.add("ended"); });
    source.addEventListener("logout", function () {
      source.close();
      window.location.assign("/ui/login");
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var live = document.querySelectorAll("[data-poll]");
    for (var i = 0; i < live.length; i++) { poll(live[i]); }
    var logs = document.querySelectorAll("pre[data-stream]");
    for (var j = 0; j < logs.length; j++) { stream(logs[j]); }
  });
})();
