//! Unit tests of the cut, driven with the core and no threads.
