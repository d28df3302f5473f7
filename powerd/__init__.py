"""powerd: pick the fastest Jetson power mode under a power budget, while your job trains.

In a training script:

    import powerd
    with powerd.request(budget_w=20, workload="resnet18-imagenet-bs16") as job:
        for batch in loader:
            ...
            job.step()
"""

from powerd.client import InferenceJob, Job, NoopJob, request
from powerd.errors import (
    BudgetRejected,
    DaemonUnavailable,
    InvalidArgument,
    JobClosed,
    JobReleased,
    PowerdError,
    RequestFailed,
)
from powerd.modes import PowerMode

__version__ = "0.1.0"

__all__ = [
    "BudgetRejected",
    "DaemonUnavailable",
    "InferenceJob",
    "InvalidArgument",
    "Job",
    "JobClosed",
    "JobReleased",
    "NoopJob",
    "PowerMode",
    "PowerdError",
    "RequestFailed",
    "request",
]
