"""What normx knows of models: where each family keeps its embeddings, blocks, final norm and head-on-top (an
:class:`Adapter` per model class, in a registry), how to reach their modules through PEFT wrappers, how to merge a PEFT
adapter into its base for serving, and how to load a model from a folder, a PEFT adapter folder or a hub id.

Layer 1, above ``normx.errors`` and ``normx._torch`` only: everything else in normx may import it, it imports
nothing of normx's other layers. Model-family module paths live here and nowhere else.
"""

from normx.models.adapter import Adapter, HeadKind
from normx.models.merging import merge_adapters
from normx.models.modules import active_module, first_parameter, linear_columns, unwrap_model
from normx.models.registry import (
    encoder_blocks,
    encoder_classes,
    encoder_reason,
    get_adapter,
    register_adapter,
    registered_adapters,
    supported_models,
)

__all__ = ["Adapter", "HeadKind", "active_module", "encoder_blocks", "encoder_classes", "encoder_reason",
           "first_parameter", "get_adapter", "linear_columns", "merge_adapters",
           "register_adapter", "registered_adapters", "supported_models", "unwrap_model"]
