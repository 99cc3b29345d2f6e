#!/usr/bin/env bash
# The GAN batch study (docs/gan.md, "The batch study"), with `troupe sweep`, sized
# for a small machine:
#   equal_images: batch 64, 256, 1024 x linear and square-root learning-rate
#     scaling (with the config's warm-up), IMAGES real images per point,
#     classifier-FID every IMAGES/8 images;
#   replicas_2: batch 256, linear, on 2 in-process replicas (cross-replica
#     batch norm), the same IMAGES: the same step as 1 replica (gan_trainer_test)
#     trained for as long, the check that the replica axis changes speed, not
#     quality (its speed for every batch: `troupe bench gan --only speed`);
#   equal_steps: batch 64 and 256 for as many steps as batch 1024 takes in
#     IMAGES (IMAGES / 1024), both scalings; batch 1024's point at those steps
#     is its equal_images run.
# Resumable: rerun the same command (a sweep skips finished runs and resumes
# the others from their checkpoints).
#   tools/gan_batch_study.sh [TROUPE] [OUT_DIR] [IMAGES]
#   defaults: build/release/cli/troupe, runs/batch_study, 500000 images
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
troupe=${1:-$root/build/release/cli/troupe}
out=${2:-$root/runs/batch_study}
images=${3:-500000}
config=$root/configs/gan_fashion_mnist.textproto
mkdir -p "$out"

# Two sweeps at a time: the G+D step keeps ~1.5 of 2 cores busy, so
# equal_images runs beside equal_steps then replicas_2 (separate run
# directories; each sweep resumes its own).
"$troupe" sweep "$config" --dir "$out/equal_images" \
  --set gan.total_images="$images" --set gan.eval_every_images=$((images / 8)) \
  --grid gan.lr_scaling=LINEAR,SQRT --grid gan.batch_size=64,256,1024 &
equal_images=$!

steps=$((images / 1024))
zipped=""
for batch in 64 256; do
  total=$((batch * steps))
  zipped="$zipped${zipped:+,}$batch:$total:$((total / 4))"
done
"$troupe" sweep "$config" --dir "$out/equal_steps" \
  --grid gan.lr_scaling=LINEAR,SQRT --grid gan.batch_size:gan.total_images:gan.eval_every_images="$zipped"
"$troupe" sweep "$config" --dir "$out/replicas_2" \
  --set gan.total_images="$images" --set gan.eval_every_images=$((images / 8)) \
  --set gan.engine.replicas=2 --set gan.lr_scaling=LINEAR --set gan.batch_size=256
wait "$equal_images"
