"""The conformance harness: runs cases against targets and judges them with the oracles."""
