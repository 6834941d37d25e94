// The dashboard's refresh: on the pages with the switch (#stalwart-refresh), once it is on,
// the page is fetched again every few seconds (the same address: the same filters, the same
// page of the list) and each part marked data-refresh="NAME" is swapped for its new copy in
// place, so the scroll position stays. The switch is remembered in this browser. Nothing is
// fetched while the tab is hidden, nor while the operator is using a part: a row selected
// for a bulk action, or a field with the focus.
(function () {
  "use strict";
  const KEY = "stalwart.dashboard.refresh";

  function start() {
    const toggle = document.getElementById("stalwart-refresh");
    if (!toggle) {
      return;
    }
    const interval = 1000 * Number(toggle.dataset.interval || 5);
    toggle.checked = window.localStorage.getItem(KEY) === "on";
    toggle.addEventListener("change", function () {
      window.localStorage.setItem(KEY, toggle.checked ? "on" : "off");
    });

    function inUse() {
      const focused = document.activeElement;
      return Boolean(
        document.querySelector("[data-refresh] input[type=checkbox]:checked") ||
          (focused && focused !== document.body && focused.closest("[data-refresh]"))
      );
    }

    let fetching = false;
    async function refresh() {
      if (!toggle.checked || document.hidden || fetching || inUse()) {
        return;
      }
      fetching = true;
      try {
        const response = await fetch(window.location.href, {
          credentials: "same-origin",
          headers: { Accept: "text/html" },
        });
        // A redirect is a logout, or the page's object gone: leave the page as it is.
        if (!response.ok || response.redirected || inUse()) {
          return;
        }
        const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
        for (const part of document.querySelectorAll("[data-refresh]")) {
          const copy = fresh.querySelector('[data-refresh="' + part.dataset.refresh + '"]');
          if (copy) {
            part.replaceWith(document.importNode(copy, true));
          }
        }
        document.documentElement.dataset.stalwartRefreshed = String(Date.now());
      } catch (error) {
        // The server out of reach for a moment: the next turn tries again.
      } finally {
        fetching = false;
      }
    }

    window.setInterval(refresh, interval);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
