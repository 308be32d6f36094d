#!/usr/bin/env bash
# The real SQS clients the tests drive (tests/sqs.rs, and the README's AWS CLI example through tests/readme.rs): two
# Python virtualenvs under target/sqs-clients/, made once.
#   json/   a current boto3 and the AWS CLI (v1, from PyPI): the JSON 1.0 protocol
#   query/  boto3 and botocore 1.34.89, the last release that speaks SQS's query protocol (form requests, XML)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/sqs-clients
make_env() {
  local name=$1
  shift
  if [ -x "$dir/$name/bin/python" ] && [ -f "$dir/$name/.installed" ] && [ "$(cat "$dir/$name/.installed")" = "$*" ]; then
    return
  fi
  rm -rf "${dir:?}/$name"
  python3 -m venv "$dir/$name"
  "$dir/$name/bin/pip" install -q --disable-pip-version-check "$@"
  echo "$*" >"$dir/$name/.installed"
}
make_env json boto3==1.44.18 botocore==1.44.18 awscli==1.46.3
make_env query boto3==1.34.89 botocore==1.34.89
echo "SQS clients ready in $dir"
