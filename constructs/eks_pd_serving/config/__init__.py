"""The one configuration model, parsed once and validated before any construct is built.

    settings.py  every setting: type, default, documentation
    fields.py    rules on one value
    rules.py     rules across settings
    model.py     DeploymentConfig: the above, derived facts, parsing of CDK context
    errors.py    ConfigError
The GPU layout (groups, ids, labels) is ``eks_pd_serving.layout``.
"""

from ..layout import GpuGroup
from .errors import ConfigError
from .model import DeploymentConfig

__all__ = ["ConfigError", "DeploymentConfig", "GpuGroup"]
