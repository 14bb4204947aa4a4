"""flora.validation: Great Expectations suites for every table the engine reads or writes.

``validate_table(name, df)`` / ``assert_valid(name, df)`` for engine tables (suites are
declared with ``register_suite`` in this package's modules), and
``flora.validation.raw.validate_dataset(path)`` for raw episodes. See docs/orchestration.md.
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
]
