//! gpuslice node daemon.
