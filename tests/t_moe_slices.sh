#!/bin/sh
# t_moe_slices.sh: t_slices.sh (issue 19) for a mixture of experts (issue 13): a node without the
# model keeps only its whole experts, the routers and its columns of the rest, and a re-plan
# fetches only the difference.
SLICES_NAME=t_moe_slices \
	SLICES_MODEL="--arch mixtral --dim 1024 --layers 4 --heads 8 --kv-heads 4 --ffn 1024 \
--experts 8 --experts-used 2 --vocab 512" \
	exec sh tests/t_slices.sh
