"""Test data and tools, kept out of the runtime layers: hand-checkable synthetic Programs
(`programs`), the profile-file fuzzer (`fuzz`) and synthetic Reports. Tests and benches
import them; no runtime module does."""
