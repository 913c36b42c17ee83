"""Fidelity: real data-parallel runs against their emulation (``emu validate``)."""

from emu.validate.core import DEFAULT_SETTINGS, QUICK_SETTINGS, Setting, run_validation
from emu.validate.fit import LinkFit, fit_link
from emu.validate.report import CaseFailure, CaseResult, ValidateReport, save_report, trusted_enough

__all__ = ["DEFAULT_SETTINGS", "QUICK_SETTINGS", "CaseFailure", "CaseResult", "LinkFit", "Setting", "ValidateReport",
           "fit_link", "run_validation", "save_report", "trusted_enough"]
