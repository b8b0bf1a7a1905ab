// Sorting and filtering of the report's tables: plain JS, nothing fetched.
(function () {
  "use strict";
  function key(cell) {
    var raw = cell.getAttribute("data-sort");
    var text = raw === null ? cell.textContent.trim() : raw;
    var number = Number(text);
    if (text !== "" && isFinite(number)) return [0, number];
    return text === "" || text === "\u2013" ? [2, ""] : [1, text.toLowerCase()];
  }
  function sortBy(table, th, col) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
    Array.prototype.forEach.call(th.parentNode.cells, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
    rows.sort(function (a, b) {
      var x = key(a.cells[col]), y = key(b.cells[col]);
      if (x[0] !== y[0]) return x[0] - y[0];  // empty cells last either way
      return (x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0) * dir;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  }
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.tabIndex = 0;
      th.title = "sort";
      th.addEventListener("click", function () { sortBy(table, th, col); });
      th.addEventListener("keydown", function (e) {
        if (e.key === "Enter") sortBy(table, th, col);
      });
    });
  });
  var table = document.getElementById("cells-table");
  var text = document.getElementById("cell-filter");
  var only = document.getElementById("cell-attention");
  var count = document.getElementById("cell-count");
  if (!table || !text || !only || !count) return;
  function apply() {
    var words = text.value.toLowerCase().split(/\s+/).filter(Boolean);
    var rows = table.tBodies[0].rows, shown = 0;
    Array.prototype.forEach.call(rows, function (row) {
      var hay = row.textContent.toLowerCase();
      var ok = words.every(function (w) { return hay.indexOf(w) >= 0; }) &&
        (!only.checked || row.getAttribute("data-attention") === "1");
      row.hidden = !ok;
      if (ok) shown += 1;
    });
    count.textContent = shown + " of " + rows.length + " cells";
  }
  text.addEventListener("input", apply);
  only.addEventListener("change", apply);
  apply();
})();
