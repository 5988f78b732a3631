"""What is trained, on what, and how: the specs a plan, a run and a trace start from.

- ``model``: ModelSpec (the transformer's shape and its parameter count);
- ``hf_config``: ModelSpec from a catalog name, a TOML file or a Hugging Face config.json;
- ``hf_defaults``: transformers' config-class defaults for the keys a family's config.json leaves out;
- ``cluster``: AcceleratorSpec, ClusterSpec and ``load_cluster`` (catalog or profile);
- ``gpu_keys``, ``host_keys``: a profile's op-model and host-time keys;
- ``train``: TrainSpec, precisions, optimizers, the default sequence;
- ``optimizer``: the runtime's optimizer settings.

Pure Python (no torch). The names below are the public face, ``meshwise.spec.X``.
"""

from meshwise.spec.cluster import AcceleratorSpec, ClusterSpec, LinkSpec, load_cluster
from meshwise.spec.hf_config import load_model
from meshwise.spec.model import MLP_KINDS, ModelSpec, cached_hash
from meshwise.spec.train import OPTIMIZERS, PRECISIONS, TrainSpec, default_seq_len

__all__ = [
    "MLP_KINDS",
    "ModelSpec",
    "cached_hash",
    "load_model",
    "AcceleratorSpec",
    "ClusterSpec",
    "LinkSpec",
    "load_cluster",
    "OPTIMIZERS",
    "PRECISIONS",
    "TrainSpec",
    "default_seq_len",
]
