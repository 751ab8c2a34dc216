"""Tensor and expert parallelism on ``torch.distributed`` (see ``docs/parallelism.md``).

* :mod:`shard_plan`: which slice of every tensor a rank holds;
* :mod:`sharding`: turning a model built on the meta device into one rank's shard;
* :mod:`shard_loader`: loading only a rank's slices from safetensors files;
* :mod:`process_group`: process-group set-up for spawned workers and for ``torchrun``;
* :mod:`launch`: the ranks ``torchrun`` starts (``--distributed-executor-backend external_launcher``);
* :mod:`worker`: the loop of a model worker (rank > 0);
* :mod:`executor`: rank 0's runner, which broadcasts each step's batch and watches the workers;
* :mod:`expert_exchange`: MoE dispatch/combine of the routed rows across data-parallel attention replicas;
* :mod:`dp_runner`: rank 0's runner under data-parallel attention (every replica's batch each step).

The collectives the model layers call (identity on one rank) live in :mod:`atom.comm`, outside this
package, so the model does not import the package that shards it.
"""
