package launcher

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// Slurm: inside an allocation (SLURM_JOB_ID set) gorun starts the ranks as
// the tasks of one job step, "srun --ntasks=N ... gorun --slurm-rank
// PROGRAM ARGS", and serves the store as usual. On each node srun runs
// gorun in its rank mode (RunSlurmRank), which turns Slurm's task
// variables into gompi's and then executes PROGRAM in its place.

// SlurmRankFlag is the first argument that makes gorun run as one rank of
// a Slurm step (RunSlurmRank).
const SlurmRankFlag = "--slurm-rank"

// InSlurmAllocation reports whether the environment is that of a Slurm
// allocation (salloc, sbatch) in which srun can start a step.
func InSlurmAllocation(getenv func(string) string) bool {
	if getenv("SLURM_JOB_ID") == "" {
		return false
	}
	_, err := exec.LookPath("srun")
	return err == nil
}

// startSrun starts the whole job as one srun step.
func (j *job) startSrun(path string, env []string) error {
	self := j.cfg.Self
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return err
		}
	}
	args := []string{"--ntasks=" + strconv.Itoa(j.cfg.NP), "--kill-on-bad-exit=1", "--mpi=none", "--input=0"}
	args = append(args, "--label") // gorun turns the labels into its tags, or strips them
	if j.cfg.Oversubscribe {
		args = append(args, "--oversubscribe", "--overcommit")
	}
	args = append(args, self, SlurmRankFlag, path)
	args = append(args, j.cfg.Args...)
	cmd := exec.Command("srun", args...)
	cmd.Env = env
	covers := make([]int, j.cfg.NP)
	for i := range covers {
		covers[i] = i
	}
	if j.cfg.Verbose {
		j.out.printf("starting the ranks with srun %s", strings.Join(args, " "))
	}
	return j.startProc(cmd, covers, "srun", true)
}

// RunSlurmRank runs PROGRAM ARGS (args) as the rank that Slurm's task
// variables name: it sets GOMPI_RANK from SLURM_PROCID, GOMPI_LOCAL_RANK
// from SLURM_LOCALID and GOMPI_LOCAL_SIZE from this node's entry of
// SLURM_STEP_TASKS_PER_NODE, and then executes PROGRAM in this process.
// It returns only on error.
func RunSlurmRank(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%s: missing PROGRAM", SlurmRankFlag)
	}
	rank, err := strconv.Atoi(os.Getenv("SLURM_PROCID"))
	if err != nil {
		return fmt.Errorf("%s: SLURM_PROCID=%q: not a Slurm task", SlurmRankFlag, os.Getenv("SLURM_PROCID"))
	}
	local, err := strconv.Atoi(os.Getenv("SLURM_LOCALID"))
	if err != nil {
		return fmt.Errorf("%s: SLURM_LOCALID=%q", SlurmRankFlag, os.Getenv("SLURM_LOCALID"))
	}
	node, _ := strconv.Atoi(os.Getenv("SLURM_NODEID"))
	per := os.Getenv("SLURM_STEP_TASKS_PER_NODE")
	if per == "" {
		per = os.Getenv("SLURM_TASKS_PER_NODE")
	}
	localSize, err := tasksOnNode(per, node)
	if err != nil {
		return fmt.Errorf("%s: %w", SlurmRankFlag, err)
	}
	os.Setenv(EnvRank, strconv.Itoa(rank))
	os.Setenv(EnvLocalRank, strconv.Itoa(local))
	os.Setenv(EnvLocalSize, strconv.Itoa(localSize))
	path, err := exec.LookPath(args[0])
	if err != nil {
		return err
	}
	return syscall.Exec(path, args, os.Environ())
}

// tasksOnNode returns the number of tasks on node (0-based) from Slurm's
// tasks-per-node list, such as "2(x3),1": 2 tasks on each of 3 nodes,
// then 1.
func tasksOnNode(list string, node int) (int, error) {
	if node < 0 {
		return 0, fmt.Errorf("node %d", node)
	}
	for _, part := range strings.Split(list, ",") {
		n, reps := part, "1"
		if i := strings.Index(part, "(x"); i >= 0 && strings.HasSuffix(part, ")") {
			n, reps = part[:i], part[i+2:len(part)-1]
		}
		tasks, err1 := strconv.Atoi(n)
		count, err2 := strconv.Atoi(reps)
		if err1 != nil || err2 != nil || tasks < 1 || count < 1 {
			return 0, fmt.Errorf("tasks per node %q: bad entry %q", list, part)
		}
		if node < count {
			return tasks, nil
		}
		node -= count
	}
	return 0, fmt.Errorf("tasks per node %q has no entry for this node", list)
}
