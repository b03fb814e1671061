"""Where the suite and the repository are, for tests in any folder under tests/."""

import os

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(TESTS_DIR)
