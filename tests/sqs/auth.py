"""SigV4 against berth's SQS face with `sqs_credentials` set (tests/sqs.rs): every refusal AWS makes, by a real
signer (botocore's).

    python auth.py ENDPOINT      # the server knows AKIDEXAMPLE with secret "secret"
"""

import datetime
import json
import sys
import urllib.error
import urllib.request
from unittest import mock

import boto3
import botocore
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

endpoint = sys.argv[1]


def client(key, secret):
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=botocore.config.Config(retries={"max_attempts": 1}),
    )


def refused(code, status, call, *args, **kwargs):
    try:
        call(*args, **kwargs)
    except botocore.exceptions.ClientError as e:
        got = (e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"])
        assert got == (code, status), f"wanted {(code, status)}, got {e.response}"
        return
    raise AssertionError(f"not refused: wanted {code}")


good = client("AKIDEXAMPLE", "secret")
url = good.create_queue(QueueName="signed")["QueueUrl"]
good.send_message(QueueUrl=url, MessageBody="signed")
refused("SignatureDoesNotMatch", 403, client("AKIDEXAMPLE", "wrong").list_queues)
refused("InvalidClientTokenId", 403, client("AKIDUNKNOWN", "secret").list_queues)


def raw(headers, body):
    request = urllib.request.Request(endpoint + "/", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request) as reply:
            return reply.status, json.loads(reply.read() or b"{}"), dict(reply.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), dict(e.headers)


target = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"}
status, body, headers = raw(target, b"{}")
assert status == 403 and body["__type"].endswith("#MissingAuthenticationToken"), (status, body)


def signed(when, body=b"{}", tamper=None):
    request = AWSRequest(method="POST", url=endpoint + "/", data=body, headers=dict(target))
    # botocore reads its clock through botocore.auth.get_current_datetime (a naive UTC datetime).
    with mock.patch("botocore.auth.get_current_datetime", return_value=when.replace(tzinfo=None)):
        SigV4Auth(Credentials("AKIDEXAMPLE", "secret"), "sqs", "us-east-1").add_auth(request)
    assert request.context["timestamp"] == when.strftime("%Y%m%dT%H%M%SZ"), "the signer's clock was not set"

    headers = dict(request.headers.items())
    if tamper:
        body = tamper
    return raw(headers, body)


now = datetime.datetime.now(datetime.timezone.utc)
status, body, _ = signed(now)
assert status == 200, (status, body)
status, body, headers = signed(now - datetime.timedelta(minutes=6))
assert status == 403 and body["__type"].endswith("#SignatureDoesNotMatch"), (status, body)
assert "expired" in body["message"].lower(), body
status, body, _ = signed(now + datetime.timedelta(minutes=6))
assert status == 403 and body["__type"].endswith("#SignatureDoesNotMatch"), (status, body)
status, body, _ = signed(now, body=b'{"QueueNamePrefix": "a"}', tamper=b'{"QueueNamePrefix": "b"}')
assert status == 403 and body["__type"].endswith("#SignatureDoesNotMatch"), ("a body changed after signing", status, body)
status, body, _ = raw(dict(target, Authorization="AWS4-HMAC-SHA256 garbage"), b"{}")
assert status == 400 and body["__type"].endswith("#IncompleteSignature"), (status, body)
# Nothing a refused request asked for happened.
assert [m["Body"] for m in good.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]] == ["signed"]
print("ok: auth")
