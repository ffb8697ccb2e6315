//! gpuslice scheduler.
