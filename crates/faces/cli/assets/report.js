// pagewise report: draws the plots described by the JSON in #pw-data with
// uPlot (shipped in the page) and a canvas for heatmaps, then writes what
// it drew into #pw-status (plots, points, painted pixels, errors) for a
// reader or a test to check.
(function () {
  "use strict";
  var status = { plots: [], errors: [] };
  window.addEventListener("error", function (e) {
    status.errors.push(String(e.message || e));
    publish();
  });
  var COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"];

  function publish() {
    var el = document.getElementById("pw-status");
    el.textContent = JSON.stringify(status);
    document.body.setAttribute("data-plots-drawn", String(status.plots.length));
  }

  function hexRgb(h) {
    return [parseInt(h.substr(1, 2), 16), parseInt(h.substr(3, 2), 16), parseInt(h.substr(5, 2), 16)];
  }

  // Pixels of `canvas` inside `box` (device pixels) near one of `colors`.
  function painted(canvas, box, colors) {
    var ctx = canvas.getContext("2d");
    var img = ctx.getImageData(box.left, box.top, Math.max(1, box.width), Math.max(1, box.height)).data;
    var want = colors.map(hexRgb), n = 0;
    for (var i = 0; i < img.length; i += 4) {
      if (img[i + 3] < 128) continue;
      for (var k = 0; k < want.length; k++) {
        var c = want[k];
        if (Math.abs(img[i] - c[0]) < 24 && Math.abs(img[i + 1] - c[1]) < 24 && Math.abs(img[i + 2] - c[2]) < 24) {
          n++;
          break;
        }
      }
    }
    return n;
  }

  function section(p) {
    var div = document.createElement("section");
    div.className = "plot";
    div.id = p.id;
    var h = document.createElement("h2");
    h.textContent = p.title;
    div.appendChild(h);
    if (p.note) {
      var note = document.createElement("p");
      note.className = "note";
      note.textContent = p.note;
      div.appendChild(note);
    }
    document.getElementById("pw-plots").appendChild(div);
    return div;
  }

  function lines(p, div) {
    var colors = p.series.map(function (_, i) { return COLORS[i % COLORS.length]; });
    var points = p.kind === "points";
    var opts = {
      width: Math.min(1100, window.innerWidth - 40),
      height: 320,
      scales: { x: { time: false } },
      axes: [{ label: p.xlabel }, { label: p.ylabel, size: 70 }],
      series: [{ label: p.xlabel }].concat(p.series.map(function (s, i) {
        return points
          ? { label: s.label, stroke: colors[i], width: 0, points: { show: true, size: 9, fill: colors[i], stroke: colors[i] } }
          : { label: s.label, stroke: colors[i], width: 2, points: { show: false } };
      })),
    };
    var data = [p.x].concat(p.series.map(function (s) { return s.values; }));
    var n = 0;
    p.series.forEach(function (s) { s.values.forEach(function (v) { if (v !== null) n++; }); });
    var rec = { id: p.id, kind: p.kind, series: p.series.length, points: n, painted: 0 };
    status.plots.push(rec);
    // uPlot draws after this script's turn: its pixels are counted once drawn.
    opts.hooks = { draw: [function (u) { rec.painted = painted(u.ctx.canvas, u.bbox, colors); publish(); }] };
    new uPlot(opts, data, div);
  }

  function heatmap(p, div) {
    var cols = p.x.length, rows = p.rows.length;
    var cw = Math.max(2, Math.min(14, Math.floor(1000 / Math.max(1, cols))));
    var rh = Math.max(2, Math.min(12, Math.floor(600 / Math.max(1, rows))));
    var canvas = document.createElement("canvas");
    var left = 150;
    canvas.width = left + cols * cw;
    canvas.height = rows * rh + 20;
    div.appendChild(canvas);
    var ctx = canvas.getContext("2d");
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    var cells = 0, top = 0;
    p.cells.forEach(function (row) { row.forEach(function (v) { if (v > top) top = v; }); });
    for (var r = 0; r < rows; r++) {
      for (var c = 0; c < cols; c++) {
        var v = p.cells[r][c];
        if (!v) continue;
        // Light (little written) to dark red (the most of any cell).
        var a = Math.max(0.08, Math.min(1, v / top));
        ctx.fillStyle = "rgba(214,39,40," + a.toFixed(3) + ")";
        ctx.fillRect(left + c * cw, r * rh, cw, rh);
        cells++;
      }
      if (rows <= 64 || r % Math.ceil(rows / 64) === 0) {
        ctx.fillStyle = "#333";
        ctx.font = "10px monospace";
        ctx.fillText(p.rows[r], 2, r * rh + rh);
      }
    }
    ctx.fillStyle = "#333";
    ctx.fillText(p.xlabel + ": " + p.x[0] + " to " + p.x[cols - 1] + "; darkest: " +
                 (100 * top).toFixed(1) + " % of a region written", left, rows * rh + 14);
    var box = { left: left, top: 0, width: cols * cw, height: rows * rh };
    var n = 0;
    var img = ctx.getImageData(box.left, box.top, Math.max(1, box.width), Math.max(1, box.height)).data;
    for (var i = 0; i < img.length; i += 4) if (img[i] > 200 && img[i + 1] < 200) n++;
    status.plots.push({ id: p.id, kind: "heatmap", rows: rows, cols: cols, points: cells, painted: n });
  }

  function table(p, div) {
    var t = document.createElement("table");
    var tr = document.createElement("tr");
    p.columns.forEach(function (c) { var th = document.createElement("th"); th.textContent = c; tr.appendChild(th); });
    t.appendChild(tr);
    p.rows.forEach(function (row) {
      var r = document.createElement("tr");
      row.forEach(function (v) { var td = document.createElement("td"); td.textContent = String(v); r.appendChild(td); });
      t.appendChild(r);
    });
    div.appendChild(t);
    status.plots.push({ id: p.id, kind: "table", points: p.rows.length, painted: t.rows.length - 1 });
  }

  try {
    var doc = JSON.parse(document.getElementById("pw-data").textContent);
    document.getElementById("pw-title").textContent = doc.title;
    doc.plots.forEach(function (p) {
      try {
        var div = section(p);
        if (p.kind === "heatmap") heatmap(p, div);
        else if (p.kind === "table") table(p, div);
        else lines(p, div);
      } catch (e) {
        status.errors.push(p.id + ": " + String(e && e.stack || e));
      }
    });
  } catch (e) {
    status.errors.push(String(e && e.stack || e));
  }
  publish();
})();
