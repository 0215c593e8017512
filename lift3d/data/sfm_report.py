"""Why photos did not register in structure from motion, from what COLMAP recorded, not a guess.

COLMAP's database holds the SIFT keypoints of every photo it could read and the verified matches (inliers of
a two-view geometry) of every pair it compared; the reconstruction says which photos registered. From those,
each photo left out gets one reason: COLMAP could not read it, it is tiny or shows too little texture (few
keypoints), it matches no other photo, it matches only photos that did not register either (a separate
part of the scene), or it overlaps the registered photos too little. ``explain`` groups the photos by
reason; ``describe`` turns that into one line that names the photos and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from lift3d.data.sfm_photos import CameraGroup

MIN_KEYPOINTS = 100  # fewer SIFT keypoints than this: too little to match reliably
SMALL_SIDE = 320  # photos whose longer side is under this many pixels are called tiny
MIN_VERIFIED = 15  # verified matches a pair needs to count as overlapping (COLMAP's mapper min_num_matches)
FIRST_PAIR = 100  # verified matches COLMAP's mapper needs of the pair it starts from (init_min_num_inliers)
START_ANGLE = 16  # degrees between the views of that pair (COLMAP's init_min_tri_angle)
PLACE_MIN = 30  # matches on triangulated points COLMAP needs to place a photo in a model (abs_pose_min_num_inliers)
SHOWN = 4  # photo names shown per reason
PLANAR_OR_PANORAMIC = (4, 5, 6)  # COLMAP's two-view configurations a homography explains (planar, panoramic, either)

# reason -> (what it says of the photos, the fix)
REASONS = {
    "unread": ("COLMAP could not read {names}", "save them again as 8-bit .jpg or .png"),
    "tiny": ("{names} {are} tiny ({detail}): too few SIFT features to match",
             "use larger photos (several hundred pixels a side; lift3d downscales for training itself)"),
    "plain": ("{names} {show} too little texture ({detail})",
              "retake them sharp and well exposed, with textured surfaces in view"),
    "alone": ("{names} {share} no matches with any other photo (a different subject, or no overlap)",
              "remove them, or add photos that connect them to the rest"),
    "separate": ("{names} {match} only photos that did not register either (a separate part of the scene)",
                 "add photos that bridge the two parts"),
    "same": ("{names} {show} the very view of the photos {it_they} match{es} (identical photos: no parallax)",
             "take the photos from different spots around the object (walk around it): copies of one photo, or photos "
             "taken from one spot, show no depth"),
    "weak": ("{names} {overlap} the other photos too little ({detail})",
             "take more photos with more overlap (each spot seen from 3+ photos, about 10-20 degrees apart)"),
    "parallax": ("{names} {are} seen from too nearly one spot to start a model ({detail})",
                 "take the photos from positions around the subject (walk around it), not by turning the camera in place"),
}


@dataclass
class Evidence:
    """What COLMAP recorded of the photos: keypoints per photo (absent: never read) and verified matches per pair."""

    keypoints: dict[str, int]
    verified: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> {other name: verified matches}
    same_view: dict[str, set[str]] = field(default_factory=dict)  # name -> other photos that show the identical view


class LeftOut(NamedTuple):
    """A photo that did not register: its name, what COLMAP recorded of it, and the number that matters."""

    name: str
    detail: str
    count: int = 0  # keypoints (tiny, plain) or the most verified matches with one photo (weak)


def read_evidence(database: Path) -> Evidence:
    """Keypoints per photo and verified matches per photo pair from a COLMAP database."""
    import pycolmap

    db = pycolmap.Database.open(database)
    try:
        names = {image.image_id: image.name for image in db.read_all_images()}
        evidence = Evidence({name: db.num_keypoints_for_image(image_id) for image_id, name in names.items()})
        for pair_id, geometry in zip(*db.read_two_view_geometries()):
            first, second = (names.get(i) for i in pycolmap.pair_id_to_image_pair(pair_id))
            inliers = len(geometry.inlier_matches)
            if first is not None and second is not None and inliers >= MIN_VERIFIED:
                evidence.verified.setdefault(first, {})[second] = inliers
                evidence.verified.setdefault(second, {})[first] = inliers
                if _identical_view(geometry):
                    evidence.same_view.setdefault(first, set()).add(second)
                    evidence.same_view.setdefault(second, set()).add(first)
    finally:
        db.close()
    return evidence


def _identical_view(geometry) -> bool:
    """Whether a verified pair is explained by the identity homography (within a pixel): the two photos show one
    view, with no parallax between them (copies of one photo, or a camera that did not move)."""
    import numpy as np

    if int(geometry.config) not in PLANAR_OR_PANORAMIC:
        return False
    H = np.asarray(geometry.H, dtype=np.float64)
    if H.shape != (3, 3) or not np.isfinite(H).all() or abs(H[2, 2]) < 1e-12:
        return False
    H = H / H[2, 2]
    return bool(np.abs(H[:2, :2] - np.eye(2)).max() < 1e-2 and np.abs(H[:2, 2]).max() < 1.0 and np.abs(H[2, :2]).max() < 1e-5)


def _reason(name: str, evidence: Evidence, registered: set[str], size: tuple[int, int]) -> tuple[str, LeftOut]:
    """The reason one photo did not register, and what COLMAP recorded of it."""
    if name not in evidence.keypoints:
        return "unread", LeftOut(name, "")
    keypoints = evidence.keypoints[name]
    if keypoints < MIN_KEYPOINTS:
        if max(size) < SMALL_SIDE:
            return "tiny", LeftOut(name, f"{size[0]}x{size[1]} px, {keypoints} features", keypoints)
        return "plain", LeftOut(name, f"{keypoints} SIFT features", keypoints)
    pairs = evidence.verified.get(name, {})
    if not pairs:
        return "alone", LeftOut(name, "")
    if set(pairs) <= evidence.same_view.get(name, set()):
        return "same", LeftOut(name, "")
    if registered and not registered.intersection(pairs):
        return "separate", LeftOut(name, "")
    if registered:  # what it has with the model's photos, against what placing a photo in the model takes
        best = max(count for other, count in pairs.items() if other in registered)
        return "weak", LeftOut(name, f"best: {best} verified matches with a registered photo; placing a photo takes "
                                     f"{PLACE_MIN} or more on points the model triangulated", best)
    best = max(pairs.values())
    if best < FIRST_PAIR:  # no model at all: what the pair COLMAP starts from needs
        return "weak", LeftOut(name, f"best: {best} verified matches in a pair; COLMAP starts from a pair with "
                                     f"{FIRST_PAIR} or more", best)
    return "parallax", LeftOut(name, f"best: {best} verified matches in a pair, enough, but COLMAP starts from a pair "
                                     f"seen from views {START_ANGLE} degrees or more apart", best)


def explain(names: list[str], registered: set[str], evidence: Evidence,
            groups: list[CameraGroup]) -> dict[str, list[LeftOut]]:
    """The photos of ``names`` that did not register, grouped by reason in the order of ``REASONS``."""
    sizes = {p.name: (p.width, p.height) for group in groups for p in group.photos}
    found: dict[str, list[LeftOut]] = {}
    for name in names:
        if name not in registered:
            reason, left_out = _reason(name, evidence, registered, sizes.get(name, (0, 0)))
            found.setdefault(reason, []).append(left_out)
    return {reason: found[reason] for reason in REASONS if reason in found}


def _names(entries: list[LeftOut]) -> str:
    shown = ", ".join(entry.name for entry in entries[:SHOWN])
    return shown + (f" and {len(entries) - SHOWN} more" if len(entries) > SHOWN else "")


def _detail(reason: str, entries: list[LeftOut]) -> str:
    """One photo's detail, or a summary of several."""
    if len(entries) == 1 or reason not in ("tiny", "plain", "weak", "parallax"):
        return entries[0].detail
    if reason in ("weak", "parallax"):
        return max(entries, key=lambda entry: entry.count).detail
    return entries[0].detail.split(",")[0] + " and similar" if reason == "tiny" else entries[0].detail + " or so"


def describe(reasons: dict[str, list[LeftOut]], registered: set[str],
             groups: list[CameraGroup]) -> tuple[str, list[str]]:
    """(what COLMAP reported, as clauses joined by '; ', and the fixes) for ``explain``'s reasons."""
    if not registered and list(reasons) == ["alone"]:  # every photo alone: no subject in common at all
        return (f"no two of the {len(reasons['alone'])} photos share matches ({_names(reasons['alone'])}: different "
                "subjects, or no overlap between them)", ["take overlapping photos of one subject", REASONS["weak"][1]])
    if not registered and list(reasons) == ["same"]:  # every photo shows the one view
        return (f"the {len(reasons['same'])} photos are identical ({_names(reasons['same'])} show one view from one spot: "
                "no parallax, so no depth)", [REASONS["same"][1]])
    clauses, fixes = [], []
    for reason, entries in reasons.items():
        said, fix = REASONS[reason]
        plural = len(entries) > 1
        verbs = {verb: verb if plural else verb + ("es" if verb.endswith("ch") else "s")
                 for verb in ("show", "share", "match", "overlap")}
        clauses.append(said.format(names=_names(entries), detail=_detail(reason, entries), are="are" if plural else "is",
                                   it_they="they" if plural else "it", es="" if plural else "es", **verbs))
        fixes.append(fix)
    if len(groups) > 1 and registered:  # a whole camera left out though its photos matched: its lens may be what differs
        matched = {entry.name for reason in ("separate", "weak") for entry in reasons.get(reason, [])}
        clauses += [f"none of the {len(group.photos)} photos of the camera {group.describe()} registered" for group in groups
                    if len(group.photos) > 1 and set(group.names) <= matched]
    return "; ".join(clauses), fixes
