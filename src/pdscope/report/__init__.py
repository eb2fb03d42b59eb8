"""Rendering of plain data: number formats for terminal tables, SVG charts of
:class:`pdscope.charts.Chart`, and the self-contained HTML page around them."""
