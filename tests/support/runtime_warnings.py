"""The mark of engine test modules that run Triton kernels under the interpreter: a RuntimeWarning fails the test.

Under ``TRITON_INTERPRET=1`` numpy reports a NaN or inf made from finite values (``0 / 0``, ``inf - inf``, an
overflow) as a RuntimeWarning raised inside the kernel. No kernel should compute one, not even in lanes or rows it
then discards: a padding lane gets a finite value instead (``entry_pool``'s padding score), and no caller hands a
kernel uninitialized rows (the HCA pooled rows that padding entries read are zeroed). Such a warning is either a
real bug or arithmetic on garbage that would hide one, so these modules turn it into an error.
"""

import pytest

FAIL_ON_RUNTIME_WARNINGS = pytest.mark.filterwarnings("error::RuntimeWarning")
