"""The job: config -> plan -> prepare -> execute -> finalize -> report (``run`` owns a whole run)."""

from conveyor.pipelines.job import JobPlan, JobReport, execute, plan_job, run_job

__all__ = ["JobPlan", "JobReport", "execute", "plan_job", "run_job"]
