// Package bgtask keeps what lockpool knows of its background tasks that
// log in to PostgreSQL: the leak sweep, the cluster coordination, the
// LISTEN connections, lease renewal and the lease LISTEN connection.
//
// It owns two metrics, lockpool_background_task_failing{task} (1 while
// the task's last run failed) and lockpool_background_task_failures_total
// {task}, and the rule for how often a failing task is logged: WARN at its
// first failure and again at least every WarnEvery while it keeps failing,
// so that a task that never works is never silent. The task logs itself,
// with its own message and reason; Task only says when.
//
// A nil *Task is valid (a package used without metrics): it counts
// nothing and says to log every failure.
package bgtask
