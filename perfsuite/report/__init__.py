"""What people read: terminal lines, JUnit properties, report sections."""

from perfsuite.report.terminal import (
    cell_text,
    junit_properties,
    junit_suite_properties,
    probe_lines,
    skipped_lines,
    summary_lines,
)

__all__ = ["cell_text", "junit_properties", "junit_suite_properties", "probe_lines", "skipped_lines",
           "summary_lines"]
