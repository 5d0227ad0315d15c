"""Each sale's share of its store's revenue, one store per mini-batch.

Written for ParallelRunStep's partitioned inputs: with partition_keys = ["store"], every
mini-batch holds all the rows of one store, and run() learns which from its context.
"""

from azureml_user.parallel_run import EntryScript


def init():
    EntryScript().logger.info("ready in %s", EntryScript().agent_name)


def run(mini_batch, mini_batch_context):
    store = mini_batch_context.partition_key_value["store"]
    total = mini_batch["amount"].sum()
    EntryScript().logger.info(
        "store %s: %d sales, %.2f in all", store, len(mini_batch), total
    )
    out = mini_batch[["order_id", "store"]].copy()
    out["share"] = (mini_batch["amount"] / total).round(6)
    return out  # one row per sale: the DataFrame's rows are appended
