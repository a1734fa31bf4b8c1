// Package pmi lets a gompi process join a job started by a PMI process
// manager instead of gorun: MPICH's hydra (mpiexec.hydra) or Slurm's srun
// --mpi=pmi2. It speaks the PMI-1 "simple" wire protocol (one
// "cmd=... key=value" line per message) and PMI-2 (a 6-character length
// prefix, then "cmd=...;key=value;" attributes) over the connection the
// process manager names in PMI_FD or PMI_PORT.
//
// The entry point is Join, which mpi.Init calls when the environment has
// no GOMPI_STORE but does have PMI_FD or PMI_PORT (Detect). The Job it
// returns carries the rank, size, local rank, job id and secret, and a
// Store that the transports use as their btl.Store: Set is a PMI put, and
// Get, after the job's one wire-up fence (Job.Fence), a PMI get.
//
// Client is the bare PMI connection (init, get_maxes, put, get, fence,
// abort, finalize); package pmitest serves it in tests.
package pmi
