#!/usr/bin/env bash
# The GAN batch study (README "GAN batch study"), with `troupe sweep`:
# batch 64, 256, 1024 x replicas 1, 2 (cross-replica batch norm) x linear and
# square-root learning-rate scaling (with the config's warm-up), first at
# equal images seen, then at equal steps. Resumable: rerun the same command.
#   tools/gan_batch_study.sh [TROUPE] [OUT_DIR] [IMAGES] [STEPS]
#   defaults: build/release/cli/troupe, runs/batch_study, 500000 images, 1000 steps
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
troupe=${1:-$root/build/release/cli/troupe}
out=${2:-$root/runs/batch_study}
images=${3:-500000}
steps=${4:-1000}
config=$root/configs/gan_fashion_mnist.textproto
mkdir -p "$out"

# Equal images: every point sees IMAGES real images, evaluated 5 times.
"$troupe" sweep "$config" --dir "$out/equal_images" \
  --set gan.total_images="$images" --set gan.eval_every_images=$((images / 5)) \
  --grid gan.lr_scaling=LINEAR,SQRT --grid gan.engine.replicas=1,2 --grid gan.batch_size=64,256,1024

# Equal steps: every point takes STEPS steps (batch x STEPS images), evaluated 5 times.
zipped=""
for batch in 64 256 1024; do
  total=$((batch * steps))
  zipped="$zipped${zipped:+,}$batch:$total:$((total / 5))"
done
"$troupe" sweep "$config" --dir "$out/equal_steps" \
  --grid gan.lr_scaling=LINEAR,SQRT --grid gan.engine.replicas=1,2 \
  --grid gan.batch_size:gan.total_images:gan.eval_every_images="$zipped"
