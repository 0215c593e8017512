"""``--format html``: one self-contained page that shows the Gaussians in a browser, opened from disk (file://).

The page holds everything: the Gaussians as ``.splat`` records (32 bytes each, base64 in a script tag), and a small
WebGL2 viewer (``lift3d/assets/html/splat_viewer.js``: screen-space Gaussians sorted back to front, drag to orbit,
wheel to zoom) that starts framed as the viewer and the turntable frame the content (``lift3d.framing``). Nothing is
fetched: it opens offline, from a mail attachment or a USB stick.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from lift3d.export.gaussian_density import GaussianTensors
from lift3d.framing import content_bounds, framing_distance
from lift3d.gaussians.formats.splat import splat_records
from lift3d.saving import atomic_write_bytes

VIEWER_JS = Path(__file__).resolve().parent.parent / "assets" / "html" / "splat_viewer.js"
FOVY_DEG = 50.0  # the page's vertical field of view
FILL = 0.8  # the content's bounds span this share of the page's height when it opens

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>html, body {{ margin: 0; height: 100%; overflow: hidden; background: {css_background}; }}
canvas {{ width: 100%; height: 100%; display: block; touch-action: none; cursor: grab; }}
#info {{ position: fixed; left: 10px; bottom: 8px; font: 12px system-ui, sans-serif; color: #666; user-select: none; }}</style>
</head><body><canvas id="view"></canvas><div id="info">{title} · drag to orbit, wheel to zoom</div>
<script id="splats" type="application/octet-stream">{splats}</script>
<script>const VIEW = {view};</script>
<script>{viewer}</script>
</body></html>
"""


def write_html(path: str | Path, gaussians: GaussianTensors, title: str = "lift3d", elevation_deg: float = 15.0,
               background: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> list[Path]:
    """Write the page for ``gaussians`` (with colors) at ``path``; returns [path]."""
    path = Path(path)
    records = splat_records(gaussians)
    bounds = content_bounds(gaussians.means)
    view = {"center": list(bounds.center), "distance": framing_distance(bounds.radius, FOVY_DEG, FILL),
            "fovy_deg": FOVY_DEG, "elevation_deg": elevation_deg, "background": list(background)}
    css = "#{:02x}{:02x}{:02x}".format(*(round(255 * c) for c in background))
    page = PAGE.format(title=html.escape(title), css_background=css, splats=base64.b64encode(records.tobytes()).decode("ascii"),
                       view=json.dumps(view), viewer=VIEWER_JS.read_text())
    atomic_write_bytes(path, page.encode("utf-8"))
    return [path]
