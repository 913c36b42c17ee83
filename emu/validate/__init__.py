"""Fidelity: real data-parallel runs against their emulation (``emu validate``)."""

from emu.validate.core import DEFAULT_SETTINGS, QUICK_SETTINGS, CaseResult, Setting, ValidateReport, run_validation
from emu.validate.fit import LinkFit, fit_link

__all__ = ["DEFAULT_SETTINGS", "QUICK_SETTINGS", "CaseResult", "LinkFit", "Setting", "ValidateReport", "fit_link",
           "run_validation"]
