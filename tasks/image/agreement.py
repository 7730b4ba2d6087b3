"""Pure: do all nodes hold one image, at the pinned digest?"""

from __future__ import annotations

from collections.abc import Mapping

from k3deploy.core.agreement import majority, split
from k3deploy.core.stage import Finding
from k3deploy.tasks.image.engine import NodeImage, split_ref


def image_problems(images: Mapping[str, NodeImage], digest: str | None) -> list[Finding]:
    """Nodes whose image id differs from the majority's, or that lack the pinned digest (failed findings)."""
    if not images:
        return []
    ids = {node: image.id for node, image in images.items()}
    usual = majority(ids.values())
    problems = []
    if usual is None:
        problems.append(Finding("all nodes", "same image", False, f"no majority: {split(ids, lambda i: i[:19])}"))
    for node, image in images.items():
        if usual is not None and image.id != usual:
            others = sorted(n for n, i in ids.items() if i == usual)
            held = f"holds image {image.id[:19]} for {image.ref}; {', '.join(others)} hold {usual[:19]}"
            problems.append(Finding(node, "same image", False, held))
        if digest is not None:
            repository = split_ref(image.ref)[0]
            if image.digest_of(repository) != digest:
                held = image.digest_of(repository) or "no registry digest"
                problems.append(
                    Finding(node, "pinned digest", False, f"{image.ref} is at {held}, not the pinned {digest}")
                )
    return problems
