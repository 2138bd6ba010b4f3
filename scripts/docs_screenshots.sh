#!/usr/bin/env bash
# Screenshots of the built docs site in headless Chromium (Debian: apt-get install chromium):
#   scripts/docs_screenshots.sh [OUT_DIR]   # default /tmp/draftwise-docs-shots
# Builds the site strictly, serves it on 127.0.0.1, and shoots the home page, a method page and a
# generated reference page at 1280x900.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/draftwise-docs-shots}
site=$(mktemp -d)
mkdir -p "$out"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict -q --site-dir "$site"
python3 -m http.server 8765 --bind 127.0.0.1 --directory "$site" > /dev/null 2>&1 &
server=$!
trap 'kill $server' EXIT
sleep 1
for page in "" methods/eagle/ reference/vllm-args/; do
    name=$(echo "home/$page" | tr '/' '-' | sed 's/-$//')
    chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
        --disable-component-update --disable-sync --user-data-dir="$(mktemp -d)" --window-size=1280,900 \
        --screenshot="$out/$name.png" "http://127.0.0.1:8765/$page" 2> /dev/null
    echo "$out/$name.png"
done
