"""`posenc-lm-eval`: lm-evaluation-harness's own command line with posenc's model "posenc" registered.

lm-eval 0.4 finds a model only in its own registry, and nothing on its command line imports one from outside the
package (EleutherAI/lm-evaluation-harness issues #1457 and #1621), so this is its `lm_eval` command with
`posenc_cli.api.lm_eval_model` imported first: every flag is lm-eval's::

    posenc-lm-eval --model posenc --model_args run=runs/alibi --tasks my_task --include_path tasks/
    python -m posenc_cli.cli.lm_eval_harness --model posenc ...   # the same, without the script
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run lm-eval's command line (its arguments from `sys.argv`) with the "posenc" model registered."""
    try:
        from lm_eval.__main__ import cli_evaluate

        import posenc_cli.api.lm_eval_model  # noqa: F401  (registers "posenc")
    except ModuleNotFoundError as e:
        if e.name is None or not e.name.startswith("lm_eval"):
            raise
        sys.exit("error: lm-eval is not installed; install posenc's extra: pip install 'posenc[lm-eval]'")
    cli_evaluate()


if __name__ == "__main__":
    main()
