"""opstrata.eval.zoo — well-known architectures built in code, exported by torch.onnx, checked in opstrata.

Each model (torchvision CNNs and ViT, transformers GPT-2 / BERT / Llama at tiny configs, ...) is
built with random weights from its config — nothing is downloaded — exported by both torch.onnx
exporters (dynamo and TorchScript, dynamic batch/sequence axes), and run in an opstrata
InferenceSession against onnxruntime and torch. Needs ``pip install 'opstrata-eval[zoo]'``;
importing this package does not import torch.

>>> from opstrata.eval.zoo import list_models, MODELS
>>> "resnet18" in list_models() and MODELS["gpt2"].input_kind == "tokens"
True
"""

from __future__ import annotations

from ._compare import TOLERANCE_ORT as TOLERANCE_ORT, max_rel_error as max_rel_error
from ._export import EXPORTERS as EXPORTERS, ExportError as ExportError, export_model as export_model
from ._result import STATUSES as STATUSES, ZooResult as ZooResult
from ._runner import run_model as run_model
from ._specs import (
    MODELS as MODELS,
    ModelSpec as ModelSpec,
    UnknownModelError as UnknownModelError,
    list_models as list_models,
)

__all__ = [
    "EXPORTERS",
    "MODELS",
    "STATUSES",
    "TOLERANCE_ORT",
    "ExportError",
    "ModelSpec",
    "UnknownModelError",
    "ZooResult",
    "export_model",
    "list_models",
    "max_rel_error",
    "run_model",
]
