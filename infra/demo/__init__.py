"""`herald demo`: a guided run of the seeds' promises on the embedded stack.

    herald demo [--run-dir DIR] [--campaign-size N] [--likes N] [--keep]

runner.py orchestrates; scenes.py, campaign.py and engagement.py hold the seven scenes; loader.py
the bulk inputs that come from other systems (campaign audience, like storm), logic.py the pure
parts, ui.py the output.
"""

from infra.demo.runner import DEFAULT_CAMPAIGN_SIZE, run_demo

__all__ = ["DEFAULT_CAMPAIGN_SIZE", "run_demo"]
