"""The one configuration model, parsed once and validated before any construct is built.

    settings.py  every setting: type, default, documentation
    fields.py    rules on one value
    rules.py     rules across settings
    phases.py    one typed view of a phase's settings
    served_models.py  one typed value per served model (ModelChoice): model_source's, then served_models'
    derived.py   facts derived from the settings (functions of Settings: no import cycle)
    model.py     DeploymentConfig: the above validated once, derived facts as methods, context parsing
    errors.py    ConfigError (a setting), ConstructError (a construct's props, with its path)
The GPU layout (groups, ids, labels) is ``eks_pd_serving.layout``.
"""

from ..layout import GpuGroup
from .errors import ConfigError, ConstructError
from .model import DeploymentConfig

__all__ = ["ConfigError", "ConstructError", "DeploymentConfig", "GpuGroup"]
