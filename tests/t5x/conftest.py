"""Every test here needs t5x (and seqio, TensorFlow, which its extra brings): without it they are skipped with the
install line (README, 'With t5x itself'); `.ci/run` installs it from ../shared/wheels when that folder exists."""

import pytest


@pytest.fixture(scope="module", autouse=True)
def t5x_installed():
    try:
        import t5x  # noqa: F401
    except ImportError:
        pytest.skip("t5x is not installed: pip install --no-deps ../shared/wheels/*.whl && pip install -e '.[t5x]' "
                    "(README, 'With t5x itself')")
