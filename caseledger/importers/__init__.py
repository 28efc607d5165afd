"""Importers: other tools' raw outputs as caseledger raw records, with their own figures beside ours."""

from caseledger.errors import AisbenchImportError
from caseledger.importers.aisbench import (
    DIFFERENCES,
    AisbenchFigure,
    AisbenchImport,
    AisbenchSummary,
    read_aisbench,
)
from caseledger.importers.ledger import import_run

__all__ = [
    "DIFFERENCES",
    "AisbenchFigure",
    "AisbenchImport",
    "AisbenchImportError",
    "AisbenchSummary",
    "import_run",
    "read_aisbench",
]
