"""Fidelity: real data-parallel runs against their emulation (``emu validate``)."""

from emu.validate.core import (
    DEFAULT_SETTINGS,
    QUICK_SETTINGS,
    CaseFailure,
    CaseResult,
    Setting,
    ValidateReport,
    run_validation,
    save_report,
    trusted_enough,
)
from emu.validate.fit import LinkFit, fit_link

__all__ = ["DEFAULT_SETTINGS", "QUICK_SETTINGS", "CaseFailure", "CaseResult", "LinkFit", "Setting", "ValidateReport",
           "fit_link", "run_validation", "save_report", "trusted_enough"]
