"""flora.validation: Great Expectations suites for every table the engine reads or writes.

``validate_table(name, df)`` / ``assert_valid(name, df)`` for engine tables (suites are
declared with ``register_suite`` in this package's modules; each run is a GX Checkpoint
over a ValidationDefinition), ``write_data_docs(reports, folder)`` for their GX Data Docs,
and ``flora.validation.raw.validate_dataset(path)`` for raw episodes. See
docs/validation.md and docs/orchestration.md.
"""

from flora.validation.core import (
    ExpectationResult,
    TableSuite,
    TableValidationError,
    ValidationReport,
    assert_valid,
    columns_exist,
    common_columns,
    get_suite,
    register_suite,
    registered_tables,
    validate_table,
    write_data_docs,
)

__all__ = [
    "ExpectationResult",
    "TableSuite",
    "TableValidationError",
    "ValidationReport",
    "assert_valid",
    "columns_exist",
    "common_columns",
    "get_suite",
    "register_suite",
    "registered_tables",
    "validate_table",
    "write_data_docs",
]
