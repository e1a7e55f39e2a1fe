"""The page shell and its CSS (inline, so the installed package needs no asset files)."""

CSS = """
body { margin: 0; font-family: Inter, 'Segoe UI', Helvetica, Arial, sans-serif;
       color: #1f2933; background: #f6f7f9; }
.nav { display: flex; gap: 4px; align-items: center; background: #1f2d3d;
       padding: 0 16px; height: 46px; position: sticky; top: 0; z-index: 10; }
.brand { color: #fff; font-weight: 700; margin-right: 18px; letter-spacing: .5px; }
.nav-link { color: #c9d4e0; text-decoration: none; padding: 6px 10px; border-radius: 4px;
            font-size: 14px; }
.nav-link:hover { background: #2e4259; color: #fff; }
.nav-link.active { background: #3b75af; color: #fff; }
.nav-link.disabled { color: #66788a; }
.page { padding: 12px 22px 40px; }
h2 { font-size: 19px; margin: 10px 0 8px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.hint { color: #52606d; font-size: 13px; margin: 2px 0 6px; }
/* a command-line flag or a call in running text: never broken across lines */
.flag { white-space: nowrap; }
.status { color: #3e4c59; font-size: 13px; margin: 2px 0 6px; }
.frames { font-size: 12px; background: #f7f9fb; border: 1px solid #dde3ea; padding: 8px 10px;
          white-space: pre-wrap; word-break: break-all; max-height: 320px; overflow-y: auto; }
.graph { background: #fff; border: 1px solid #e1e5ea; border-radius: 6px; margin: 8px 0;
         min-width: 0; }
.row { display: flex; gap: 14px; align-items: flex-start; }
.static-table { border-collapse: collapse; font-size: 12px; background: #fff;
                margin: 4px 0 8px; max-width: 100%; display: block; overflow-x: auto; }
.static-table th { font-weight: 600; background: #f3f5f8; text-align: left;
                   white-space: normal; }
.static-table th, .static-table td { border: 1px solid #d6dbe1; padding: 4px 8px;
                                     max-width: 360px; overflow: hidden;
                                     text-overflow: ellipsis; white-space: nowrap; }
.half .static-table td { max-width: 150px; }
.row.two > * { flex: 1 1 0; }
.half { flex: 1 1 0; min-width: 0; }
/* a table in a half-width panel fits it: long text ends in an ellipsis (the full text is in
   the CSV download); what still does not fit scrolls inside the panel */
.half .dash-spreadsheet td.dash-cell { max-width: 150px !important; }
/* every table: headers wrap rather than widen their column */
.dash-spreadsheet th.dash-header { white-space: normal !important; }
/* every table: its first column (what a row is) stays in view while a wide table scrolls
   sideways inside its box. Collapsed borders let the scrolled cells' text show through the
   sticky cell's edge, so borders are separate, each cell drawing only its right and bottom
   (the first row and column add their top and left) */
.dash-spreadsheet .cell-table { border-collapse: separate !important; border-spacing: 0; }
.dash-spreadsheet .cell-table td, .dash-spreadsheet .cell-table th {
  border-left-width: 0 !important; border-top-width: 0 !important; }
.dash-spreadsheet .cell-table tr > :first-child { border-left-width: 1px !important; }
.dash-spreadsheet .cell-table tr:first-child > * { border-top-width: 1px !important; }
.dash-spreadsheet tr > td:first-child, .dash-spreadsheet tr > th:first-child {
  position: sticky; left: 0; z-index: 1; background-color: #fff; }
.dash-spreadsheet tr > th.dash-header:first-child { background-color: #f3f5f8; }
/* room for the filter cell's placeholder next to its case toggle */
th.dash-filter { min-width: 88px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 8px 0; }
.card { background: #fff; border: 1px solid #e1e5ea; border-left: 5px solid #9aa5b1;
        border-radius: 6px; padding: 8px 12px; min-width: 170px; }
.card.good { border-left-color: #3f9142; } .card.bad { border-left-color: #c53a32; }
.card.warn { border-left-color: #e59b25; }
.card-label { font-size: 11px; text-transform: uppercase; color: #7b8794; }
.card-value { font-size: 15px; font-weight: 600; margin-top: 2px; }
ul#advice, ul#warnings { padding-left: 0; list-style: none; margin: 4px 0; }
.advice { background: #fff; border: 1px solid #e1e5ea; border-left: 5px solid #3b75af;
          border-radius: 4px; padding: 6px 10px; margin: 4px 0; font-size: 14px; }
.advice.error { border-left-color: #c53a32; } .advice.warning { border-left-color: #e59b25; }
.message { padding: 10px 14px; border-radius: 6px; margin: 10px 0; font-size: 14px; }
.message.error, .message.oom { background: #fdecea; color: #8a1c12;
                              border: 1px solid #f5c2bd; }
.message.info { background: #eef4fb; color: #1f4f7a; border: 1px solid #c9dcf0; }
table.listing { border-collapse: collapse; background: #fff; width: 100%; font-size: 13px; }
table.listing th, table.listing td { border-bottom: 1px solid #e4e7eb; padding: 6px 10px;
                                     text-align: left; }
table.listing th { background: #f3f5f8; }
table.listing td.ok { color: #2f7a32; font-weight: 600; }
table.listing td.bad, table.listing td.error { color: #b3261e; font-weight: 600; }
.downloads { margin: 14px 0; font-size: 13px; }
.downloads .download { margin-right: 10px; color: #3b75af; }
.label { font-weight: 600; margin-right: 6px; align-self: center; }
.picker { width: 160px; }
"""

INDEX_STRING = """<!DOCTYPE html>
<html>
<head>
{%metas%}
<title>{%title%}</title>
{%favicon%}
{%css%}
<style>""" + CSS + """</style>
<script>
// A callback request the server itself refuses (waitress' 413, a 500 from outside Dash)
// leaves the page as it was without a word; exceptions inside callbacks have their own line
// (#callback-error). This one lives outside React, so the renderer never redraws it.
(function () {
  const fetch0 = window.fetch;
  window.fetch = function (input, init) {
    return fetch0.apply(this, arguments).then(function (reply) {
      const url = typeof input === "string" ? input : (input && input.url) || "";
      const box = document.getElementById("request-error");
      if (reply.status >= 400 && url.indexOf("_dash-update-component") >= 0 && box) {
        box.textContent = "The server refused an update (HTTP " + reply.status +
          (reply.status === 413 ? ", request too large" : "") + "): what is shown may " +
          "be out of date. Reload the page; if it happens again, please report it.";
        box.className = "message error";  // counted as an error only once shown
        box.hidden = false;
      }
      return reply;
    });
  };
})();
</script>
</head>
<body>
<div id="request-error" hidden></div>
{%app_entry%}
<footer>{%config%}{%scripts%}{%renderer%}</footer>
</body>
</html>
"""
