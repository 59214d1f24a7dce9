"""The serving calibration catalog (``data/serving_calibration.yaml``) and what an inference problem carries of the
package's catalogs (``serving_data``)."""

from __future__ import annotations

from functools import cache

from pydantic import ValidationError

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import catalog
from madmax_opt.io.calibration import Overlay
from madmax_opt.io.data_cache import package_yaml
from madmax_opt.model.serving_calibration import (
    FitRecord,
    ServingCalibrationEntry,
    ServingCatalog,
    ServingData,
)

CATALOG_FILE = "serving_calibration.yaml"


@cache
def serving_catalog() -> ServingCatalog:
    try:
        return ServingCatalog(**package_yaml(CATALOG_FILE),  # parsed once per content (io/data_cache.py)
                              gpu_specs=dict(catalog.gpus()))  # the GPUs the hardware order ranges over
    except ValidationError as exc:  # a broken catalog is a bug in the package, but say where
        raise ProblemError(str(exc).splitlines()[0], file=f"catalog {CATALOG_FILE}") from None


def serving_data(overlay: Overlay | None = None) -> ServingData:
    """The serving calibration catalog and the GPU catalog, as an inference problem carries them; the serving
    entries of ``overlay`` (``madmax-opt calibrate`` on serving runs) replace the catalog's fit of their pairs."""
    cat = serving_catalog()
    if overlay is not None and overlay.serving:
        mine = {(e.gpu, e.framework) for e in overlay.serving}
        fits = [ServingCalibrationEntry(gpu=e.gpu, framework=e.framework, params=e.params,
                                        fit=FitRecord(**e.fit.model_dump(include=set(FitRecord.model_fields))))
                for e in overlay.serving]
        cat = cat.model_copy(update={"entries": [e for e in cat.entries if (e.gpu, e.framework) not in mine] + fits,
                                     "user_pairs": sorted(mine)})  # the user's fits: never moved by the order
    return ServingData(catalog=cat, catalog_gpus=catalog.gpus())
