"""The job: config -> plan -> prepare -> execute -> finalize -> report."""

from conveyor.pipelines.job import JobPlan, JobReport, execute, plan_job, run_job

__all__ = ["JobPlan", "JobReport", "execute", "plan_job", "run_job"]
