"""The serving calibration catalog (``data/serving_calibration.yaml``) and what an inference problem carries of the
package's catalogs (``serving_data``)."""

from __future__ import annotations

from functools import cache
from importlib import resources

import yaml
from pydantic import ValidationError

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import catalog
from madmax_opt.io.yaml_files import SAFE_LOADER
from madmax_opt.model.serving_calibration import ServingCatalog, ServingData

CATALOG_FILE = "serving_calibration.yaml"


@cache
def serving_catalog() -> ServingCatalog:
    text = resources.files("madmax_opt").joinpath("data").joinpath(CATALOG_FILE).read_text()
    try:
        return ServingCatalog(**yaml.load(text, Loader=SAFE_LOADER))  # libyaml when present
    except ValidationError as exc:  # a broken catalog is a bug in the package, but say where
        raise ProblemError(str(exc).splitlines()[0], file=f"catalog {CATALOG_FILE}") from None


def serving_data() -> ServingData:
    """The serving calibration catalog and the GPU catalog, as an inference problem carries them."""
    return ServingData(catalog=serving_catalog(), catalog_gpus=catalog.gpus())
