"""Pure: do all nodes hold one image, at the pinned digest?"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from k3deploy.tasks.image.engine import NodeImage, split_ref


def image_problems(images: Mapping[str, NodeImage], digest: str | None) -> list[str]:
    """Nodes whose image id differs from the majority's, or that lack the pinned digest."""
    if not images:
        return []
    counts = Counter(image.id for image in images.values())
    majority, _ = counts.most_common(1)[0]
    problems = []
    for node, image in images.items():
        if image.id != majority:
            others = sorted(n for n, i in images.items() if i.id == majority)
            problems.append(
                f"{node}: holds image {image.id[:19]} for {image.ref}; {', '.join(others)} hold {majority[:19]}"
            )
        if digest is not None:
            repository = split_ref(image.ref)[0]
            if image.digest_of(repository) != digest:
                held = image.digest_of(repository) or "no registry digest"
                problems.append(f"{node}: {image.ref} is at {held}, not the pinned {digest}")
    return problems
