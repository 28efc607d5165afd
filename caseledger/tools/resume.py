"""resume: continue the SAME run as a new attempt of the first phase that is not done (the core is in
run/resume.py, so a campaign's driver resumes its points through the same code)."""

from caseledger.run.resume import ResumeResult, resume

__all__ = ["ResumeResult", "resume"]
