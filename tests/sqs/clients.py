"""SQS clients against berth's SQS face (tests/sqs.rs runs this with real SDKs).

    python clients.py ENDPOINT json    # a current boto3: the JSON 1.0 protocol, every action berth has
    python clients.py ENDPOINT query   # boto3/botocore 1.34.89: the query protocol (XML), the core actions

Every check raises on failure; the exit code says whether all passed. boto3 itself verifies MD5OfMessageBody and
MD5OfMessageAttributes where its handlers run; the attribute digest is also computed here and compared.
"""

import sys
import threading
import time

import boto3
import botocore

endpoint, protocol = sys.argv[1], sys.argv[2]
json_protocol = protocol == "json"
sqs = boto3.client(
    "sqs",
    endpoint_url=endpoint,
    region_name="eu-west-3",
    aws_access_key_id="AKIDEXAMPLE",
    aws_secret_access_key="secret",
    config=botocore.config.Config(retries={"max_attempts": 1}),
)
prefix = "t" + protocol


def fails(code, call, *args, **kwargs):
    """The call raises a ClientError whose legacy code is `code`; returns the error."""
    try:
        call(*args, **kwargs)
    except botocore.exceptions.ClientError as e:
        got = e.response["Error"]["Code"]
        assert got == code, f"wanted {code}, got {e.response['Error']}"
        return e
    raise AssertionError(f"{call.__name__} did not fail with {code}")


def check(cond, what):
    if not cond:
        raise AssertionError(what)


system_names = {"MessageSystemAttributeNames": ["All"]} if json_protocol else {"AttributeNames": ["All"]}

# ---- Queues ----
url = sqs.create_queue(QueueName=f"{prefix}-orders", Attributes={"VisibilityTimeout": "20"})["QueueUrl"]
check(url.endswith(f"/000000000000/{prefix}-orders"), url)
check(url.startswith(endpoint), f"the queue URL comes from the Host header: {url}")
check(sqs.create_queue(QueueName=f"{prefix}-orders")["QueueUrl"] == url, "create again: the same URL")
try:
    sqs.create_queue(QueueName=f"{prefix}-orders", Attributes={"VisibilityTimeout": "21"})
    raise AssertionError("a different attribute must be refused")
except sqs.exceptions.QueueNameExists:
    pass
check(sqs.get_queue_url(QueueName=f"{prefix}-orders")["QueueUrl"] == url, "get_queue_url")
try:
    sqs.get_queue_url(QueueName=f"{prefix}-missing")
    raise AssertionError("a missing queue must raise QueueDoesNotExist")
except sqs.exceptions.QueueDoesNotExist as e:
    check(e.response["Error"]["Code"] == "AWS.SimpleQueueService.NonExistentQueue", e.response)
fails("InvalidParameterValue", sqs.create_queue, QueueName="bad/name")
fails("InvalidAttributeName", sqs.create_queue, QueueName=f"{prefix}-x", Attributes={"Nope": "1"})
fails("InvalidAttributeName", sqs.create_queue, QueueName=f"{prefix}-x", Attributes={"FifoQueue": "false"})
for i in range(3):
    sqs.create_queue(QueueName=f"{prefix}-page-{i}")
listed = sqs.list_queues(QueueNamePrefix=f"{prefix}-page-")["QueueUrls"]
check([u.rsplit("/", 1)[1] for u in listed] == [f"{prefix}-page-{i}" for i in range(3)], listed)
first = sqs.list_queues(QueueNamePrefix=f"{prefix}-page-", MaxResults=2)
check(len(first["QueueUrls"]) == 2 and "NextToken" in first, first)
rest = sqs.list_queues(QueueNamePrefix=f"{prefix}-page-", MaxResults=2, NextToken=first["NextToken"])
check(len(rest["QueueUrls"]) == 1 and "NextToken" not in rest, rest)
check("QueueUrls" not in sqs.list_queues(QueueNamePrefix="nothing-has-this"), "no match: no QueueUrls")
attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
check(attrs["VisibilityTimeout"] == "20", attrs)
check(attrs["QueueArn"] == f"arn:aws:sqs:eu-west-3:000000000000:{prefix}-orders", attrs)
check(attrs["ApproximateNumberOfMessages"] == "0", attrs)
sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "30"})
check(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"] == {"VisibilityTimeout": "30"}, "set_queue_attributes")
fails("InvalidAttributeName", sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["Foobar"])

# ---- Send, receive, delete ----
attributes = {
    "color": {"DataType": "String", "StringValue": "r\u00e9d \U0001F600"},
    "n": {"DataType": "Number.int", "StringValue": "-12.5e3"},
    "raw": {"DataType": "Binary", "BinaryValue": b"\x00\xff\x07"},
}
def attributes_md5(attrs):
    """AWS's MD5 of message attributes, computed here (botocore does not check it on every path)."""
    import hashlib, struct
    out = b""
    for name in sorted(attrs):
        spec = attrs[name]
        kind = spec["DataType"].encode()
        out += struct.pack(">I", len(name.encode())) + name.encode() + struct.pack(">I", len(kind)) + kind
        if "BinaryValue" in spec:
            value = spec["BinaryValue"]
            out += b"\x02" + struct.pack(">I", len(value)) + value
        else:
            value = spec["StringValue"].encode()
            out += b"\x01" + struct.pack(">I", len(value)) + value
    return hashlib.md5(out).hexdigest()


sent = sqs.send_message(QueueUrl=url, MessageBody="hello \u00e9 \U0001F600", MessageAttributes=attributes)
check(sent["MD5OfMessageAttributes"] == attributes_md5(attributes), f"MD5OfMessageAttributes: {sent}")
check(sent["MD5OfMessageBody"] == __import__("hashlib").md5("hello \u00e9 \U0001F600".encode()).hexdigest(), sent)
check("MD5OfMessageAttributes" in sent and "SequenceNumber" not in sent, sent)
got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=5, MessageAttributeNames=["All"], **system_names)["Messages"]
check(len(got) == 1, got)
m = got[0]
check(m["MessageId"] == sent["MessageId"] and m["Body"] == "hello \u00e9 \U0001F600", m)
check(m["MessageAttributes"]["raw"]["BinaryValue"] == b"\x00\xff\x07", m)
check(m["MD5OfMessageAttributes"] == attributes_md5(m["MessageAttributes"]), m)
check(m["Attributes"]["ApproximateReceiveCount"] == "1", m)
check(abs(int(m["Attributes"]["SentTimestamp"]) - time.time() * 1000) < 60_000, m)
counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])["Attributes"]
check(counts["ApproximateNumberOfMessagesNotVisible"] == "1", counts)
# Visibility 0: back at once, a new handle; the old one no longer settles it.
sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
again = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, **system_names)["Messages"][0]
check(again["Attributes"]["ApproximateReceiveCount"] == "2" and again["ReceiptHandle"] != m["ReceiptHandle"], again)
fails("InvalidParameterValue", sqs.delete_message, QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
fails("ReceiptHandleIsInvalid", sqs.delete_message, QueueUrl=url, ReceiptHandle="garbage")
sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"], VisibilityTimeout=60)
sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])
check("Messages" not in sqs.receive_message(QueueUrl=url), "deleted")

# Batches: a bad entry fails alone, with its Id.
batch = sqs.send_message_batch(QueueUrl=url, Entries=[
    {"Id": "a", "MessageBody": "one"},
    {"Id": "b", "MessageBody": "bad \u0000 char"},
    {"Id": "c", "MessageBody": "three", "DelaySeconds": 0},
])
check(sorted(e["Id"] for e in batch["Successful"]) == ["a", "c"], batch)
check(batch["Failed"][0]["Id"] == "b" and batch["Failed"][0]["SenderFault"] and batch["Failed"][0]["Code"] == "InvalidMessageContents", batch)
fails("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", sqs.send_message_batch, QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(11)])
fails("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", sqs.send_message_batch, QueueUrl=url, Entries=[{"Id": "x", "MessageBody": "x"}, {"Id": "x", "MessageBody": "y"}])
fails("AWS.SimpleQueueService.InvalidBatchEntryId", sqs.send_message_batch, QueueUrl=url, Entries=[{"Id": "no:colons", "MessageBody": "x"}])
fails("InvalidParameterValue", sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=11)
fails("InvalidParameterValue", sqs.receive_message, QueueUrl=url, WaitTimeSeconds=21)
two = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=5)["Messages"]
while len(two) < 2:
    two += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=5)["Messages"]
check(sorted(x["Body"] for x in two) == ["one", "three"], two)
deleted = sqs.delete_message_batch(QueueUrl=url, Entries=[
    {"Id": "one", "ReceiptHandle": two[0]["ReceiptHandle"]},
    {"Id": "bad", "ReceiptHandle": "not-a-handle"},
])
check([e["Id"] for e in deleted["Successful"]] == ["one"] and deleted["Failed"][0]["Code"] == "ReceiptHandleIsInvalid", deleted)
changed = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[{"Id": "v", "ReceiptHandle": two[1]["ReceiptHandle"], "VisibilityTimeout": 0}])
check([e["Id"] for e in changed["Successful"]] == ["v"], changed)
back = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
sqs.delete_message(QueueUrl=url, ReceiptHandle=back["ReceiptHandle"])

# Long polling: returns as soon as a message arrives; waits the full time when none does.
start = time.monotonic()
check("Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2), "nothing to receive")
waited = time.monotonic() - start
check(waited >= 1.9, f"an empty long poll returned after {waited:.2f}s, not 2s")
threading.Timer(1.0, lambda: sqs.send_message(QueueUrl=url, MessageBody="late")).start()
start = time.monotonic()
late = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=15)
waited = time.monotonic() - start
check(late["Messages"][0]["Body"] == "late" and 0.5 < waited < 6, f"woken after {waited:.2f}s: {late}")
sqs.delete_message(QueueUrl=url, ReceiptHandle=late["Messages"][0]["ReceiptHandle"])

# ---- Dead letters by maxReceiveCount ----
dlq = sqs.create_queue(QueueName=f"{prefix}-dlq")["QueueUrl"]
dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
work = sqs.create_queue(QueueName=f"{prefix}-work", Attributes={
    "RedrivePolicy": '{"deadLetterTargetArn":"%s","maxReceiveCount":"1"}' % dlq_arn,
})["QueueUrl"]
policy = sqs.get_queue_attributes(QueueUrl=work, AttributeNames=["RedrivePolicy"])["Attributes"]["RedrivePolicy"]
check('"maxReceiveCount":1' in policy.replace(" ", "") and dlq_arn in policy, policy)
sqs.send_message(QueueUrl=work, MessageBody="poison", MessageAttributes={"k": {"DataType": "String", "StringValue": "v"}})
first = sqs.receive_message(QueueUrl=work, WaitTimeSeconds=5)["Messages"][0]
sqs.change_message_visibility(QueueUrl=work, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
check("Messages" not in sqs.receive_message(QueueUrl=work, WaitTimeSeconds=1), "past maxReceiveCount: not delivered again")
dead = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=5, MessageAttributeNames=["All"])["Messages"][0]
check(dead["Body"] == "poison" and dead["MessageAttributes"]["k"]["StringValue"] == "v", dead)

# ---- FIFO ----
fifo = sqs.create_queue(QueueName=f"{prefix}-jobs.fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
fattrs = sqs.get_queue_attributes(QueueUrl=fifo, AttributeNames=["All"])["Attributes"]
check(fattrs["FifoQueue"] == "true" and fattrs["ContentBasedDeduplication"] == "true", fattrs)
fails("InvalidParameterValue", sqs.create_queue, QueueName=f"{prefix}-nofifo", Attributes={"FifoQueue": "true"})
ids = {}
for group, body in [("A", "a1"), ("B", "b1"), ("A", "a2"), ("A", "a3"), ("B", "b2")]:
    r = sqs.send_message(QueueUrl=fifo, MessageBody=body, MessageGroupId=group)
    check("SequenceNumber" in r, r)
    ids[body] = r["MessageId"]
check(sqs.send_message(QueueUrl=fifo, MessageBody="a1", MessageGroupId="A")["MessageId"] == ids["a1"], "a duplicate answers the first one's MessageId")
check(sqs.send_message(QueueUrl=fifo, MessageBody="x", MessageGroupId="A", MessageDeduplicationId="d1")["MessageId"] == sqs.send_message(QueueUrl=fifo, MessageBody="y", MessageGroupId="A", MessageDeduplicationId="d1")["MessageId"], "explicit dedup ids")
fails("MissingParameter", sqs.send_message, QueueUrl=fifo, MessageBody="no group")
fails("InvalidParameterValue", sqs.send_message, QueueUrl=fifo, MessageBody="delayed", MessageGroupId="A", DelaySeconds=5)
order = []
while len(order) < 6:
    got = sqs.receive_message(QueueUrl=fifo, MaxNumberOfMessages=10, WaitTimeSeconds=2, **system_names).get("Messages", [])
    groups = [x["Attributes"]["MessageGroupId"] for x in got]
    check(len(groups) == len(set(groups)), f"two of one group at once: {got}")
    for x in got:
        order.append(x["Body"])
        sqs.delete_message(QueueUrl=fifo, ReceiptHandle=x["ReceiptHandle"])
check([b for b in order if b.startswith("a") or b in "xy"] == ["a1", "a2", "a3", "x"], order)
check([b for b in order if b.startswith("b")] == ["b1", "b2"], order)

# ---- Queue settings: delay, receive wait, message size, timestamps, tags ----
slow = sqs.create_queue(QueueName=f"{prefix}-slow", Attributes={
    "DelaySeconds": "2", "ReceiveMessageWaitTimeSeconds": "3", "MaximumMessageSize": "1024",
}, tags={"team": "payments", "env": "test"})["QueueUrl"]
sattrs = sqs.get_queue_attributes(QueueUrl=slow, AttributeNames=["All"])["Attributes"]
check(sattrs["DelaySeconds"] == "2" and sattrs["ReceiveMessageWaitTimeSeconds"] == "3", sattrs)
check(sattrs["MaximumMessageSize"] == "1024", sattrs)
check(abs(int(sattrs["CreatedTimestamp"]) - time.time()) < 60, sattrs)
check(int(sattrs["LastModifiedTimestamp"]) >= int(sattrs["CreatedTimestamp"]), sattrs)
fails("InvalidParameterValue", sqs.send_message, QueueUrl=slow, MessageBody="x" * 1025)
# The queue's delay holds a message without DelaySeconds back; a receive without WaitTimeSeconds waits the queue's
# ReceiveMessageWaitTimeSeconds for it.
sqs.send_message(QueueUrl=slow, MessageBody="held")
start = time.monotonic()
held = sqs.receive_message(QueueUrl=slow).get("Messages", [])
waited = time.monotonic() - start
check(len(held) == 1 and held[0]["Body"] == "held" and 1.9 <= waited < 3.5, f"after {waited:.2f}s: {held}")
sqs.delete_message(QueueUrl=slow, ReceiptHandle=held[0]["ReceiptHandle"])
# DelaySeconds=0 is a delay of its own: the queue's does not apply.
sqs.send_message(QueueUrl=slow, MessageBody="now", DelaySeconds=0)
now = sqs.receive_message(QueueUrl=slow, WaitTimeSeconds=0).get("Messages", [])
check([x["Body"] for x in now] == ["now"], now)
sqs.delete_message(QueueUrl=slow, ReceiptHandle=now[0]["ReceiptHandle"])
sqs.set_queue_attributes(QueueUrl=slow, Attributes={"DelaySeconds": "0"})
check(sqs.get_queue_attributes(QueueUrl=slow, AttributeNames=["DelaySeconds"])["Attributes"] == {"DelaySeconds": "0"}, "DelaySeconds set")
fails("InvalidAttributeValue", sqs.set_queue_attributes, QueueUrl=slow, Attributes={"DelaySeconds": "901"})
fails("InvalidAttributeValue", sqs.set_queue_attributes, QueueUrl=slow, Attributes={"MaximumMessageSize": "1023"})

check(sqs.list_queue_tags(QueueUrl=slow)["Tags"] == {"team": "payments", "env": "test"}, "tags at creation")
sqs.tag_queue(QueueUrl=slow, Tags={"env": "prod", "owner": "ops"})
sqs.untag_queue(QueueUrl=slow, TagKeys=["team"])
check(sqs.list_queue_tags(QueueUrl=slow)["Tags"] == {"env": "prod", "owner": "ops"}, "tags changed")
fails("InvalidParameterValue", sqs.tag_queue, QueueUrl=slow, Tags={"aws:reserved": "x"})
check("Tags" not in sqs.list_queue_tags(QueueUrl=url), "no tags")

# ---- Permissions: kept in the Policy, not enforced ----
import json
sqs.add_permission(QueueUrl=slow, Label="share", AWSAccountIds=["111122223333"], Actions=["SendMessage", "ReceiveMessage"])
policy = json.loads(sqs.get_queue_attributes(QueueUrl=slow, AttributeNames=["Policy"])["Attributes"]["Policy"])
statement = policy["Statement"][0]
check(statement["Sid"] == "share" and statement["Principal"]["AWS"] == "arn:aws:iam::111122223333:root", policy)
check(statement["Action"] == ["SQS:SendMessage", "SQS:ReceiveMessage"], policy)
fails("InvalidParameterValue", sqs.add_permission, QueueUrl=slow, Label="share", AWSAccountIds=["111122223333"], Actions=["SendMessage"])
sqs.remove_permission(QueueUrl=slow, Label="share")
check("Policy" not in sqs.get_queue_attributes(QueueUrl=slow, AttributeNames=["All"])["Attributes"], "the last permission removed")
fails("InvalidParameterValue", sqs.remove_permission, QueueUrl=slow, Label="share")

# ---- Purge: every message goes, leased ones included ----
for i in range(5):
    sqs.send_message(QueueUrl=slow, MessageBody=f"p{i}")
leased = sqs.receive_message(QueueUrl=slow, WaitTimeSeconds=1)["Messages"][0]
sqs.purge_queue(QueueUrl=slow)
counts = sqs.get_queue_attributes(QueueUrl=slow, AttributeNames=["All"])["Attributes"]
check(counts["ApproximateNumberOfMessages"] == "0" and counts["ApproximateNumberOfMessagesNotVisible"] == "0", counts)
check("Messages" not in sqs.receive_message(QueueUrl=slow, WaitTimeSeconds=0), "purged")
fails("InvalidParameterValue", sqs.delete_message, QueueUrl=slow, ReceiptHandle=leased["ReceiptHandle"])
sqs.send_message(QueueUrl=slow, MessageBody="after")
check(sqs.receive_message(QueueUrl=slow, WaitTimeSeconds=1)["Messages"][0]["Body"] == "after", "the queue goes on after a purge")

# ---- Dead-letter sources and message move tasks ----
arn = lambda name: f"arn:aws:sqs:eu-west-3:000000000000:{name}"
dlq2 = sqs.create_queue(QueueName=f"{prefix}-dlq2", Attributes={
    "RedriveAllowPolicy": json.dumps({"redrivePermission": "byQueue", "sourceQueueArns": [arn(f"{prefix}-work2")]}),
})["QueueUrl"]
work2 = sqs.create_queue(QueueName=f"{prefix}-work2", Attributes={
    "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn(f"{prefix}-dlq2"), "maxReceiveCount": 1}),
})["QueueUrl"]
fails("InvalidParameterValue", sqs.create_queue, QueueName=f"{prefix}-denied", Attributes={
    "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn(f"{prefix}-dlq2"), "maxReceiveCount": 1}),
})
check(sqs.list_dead_letter_source_queues(QueueUrl=dlq2)["queueUrls"] == [work2], "dead-letter sources")
check(sqs.list_dead_letter_source_queues(QueueUrl=work2).get("queueUrls", []) == [], "no sources")
fails("InvalidParameterValue", sqs.start_message_move_task, SourceArn=arn(f"{prefix}-work2"))
for i in range(3):
    sqs.send_message(QueueUrl=work2, MessageBody=f"d{i}")
got = []
while len(got) < 3:
    got += sqs.receive_message(QueueUrl=work2, MaxNumberOfMessages=10, WaitTimeSeconds=2)["Messages"]
sqs.change_message_visibility_batch(QueueUrl=work2, Entries=[
    {"Id": str(i), "ReceiptHandle": x["ReceiptHandle"], "VisibilityTimeout": 0} for i, x in enumerate(got)])
check("Messages" not in sqs.receive_message(QueueUrl=work2, WaitTimeSeconds=1), "all three dead-lettered")
check(sqs.get_queue_attributes(QueueUrl=dlq2, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]["ApproximateNumberOfMessages"] == "3", "three in the dead-letter queue")


def wait_task(source, status):
    for _ in range(100):
        tasks = sqs.list_message_move_tasks(SourceArn=source, MaxResults=10)["Results"]
        if tasks and tasks[0]["Status"] == status:
            return tasks
        time.sleep(0.1)
    raise AssertionError(f"no {status} task: {tasks}")


handle = sqs.start_message_move_task(SourceArn=arn(f"{prefix}-dlq2"))["TaskHandle"]
done = wait_task(arn(f"{prefix}-dlq2"), "COMPLETED")[0]
check(done["ApproximateNumberOfMessagesMoved"] == 3 and done["ApproximateNumberOfMessagesToMove"] == 3, done)
check("TaskHandle" not in done and done["SourceArn"] == arn(f"{prefix}-dlq2"), done)
back = []
while len(back) < 3:
    back += sqs.receive_message(QueueUrl=work2, MaxNumberOfMessages=10, WaitTimeSeconds=2)["Messages"]
check(sorted(x["Body"] for x in back) == ["d0", "d1", "d2"], back)
for x in back:
    sqs.delete_message(QueueUrl=work2, ReceiptHandle=x["ReceiptHandle"])
fails("AWS.SimpleQueueService.UnsupportedOperation", sqs.cancel_message_move_task, TaskHandle=handle)
fails("ResourceNotFoundException", sqs.cancel_message_move_task, TaskHandle="bm90LWEtdGFzaw==")
fails("ResourceNotFoundException", sqs.start_message_move_task, SourceArn=arn(f"{prefix}-nothing"))
# A paced task, cancelled: at most one message a second, and only one task per source at a time.
for i in range(5):
    sqs.send_message(QueueUrl=dlq2, MessageBody=f"slow{i}")
paced = sqs.start_message_move_task(SourceArn=arn(f"{prefix}-dlq2"), DestinationArn=arn(f"{prefix}-work2"), MaxNumberOfMessagesPerSecond=1)["TaskHandle"]
fails("AWS.SimpleQueueService.UnsupportedOperation", sqs.start_message_move_task, SourceArn=arn(f"{prefix}-dlq2"))
running = sqs.list_message_move_tasks(SourceArn=arn(f"{prefix}-dlq2"), MaxResults=10)["Results"]
check(running[0]["TaskHandle"] == paced and running[0]["MaxNumberOfMessagesPerSecond"] == 1 and len(running) == 2, running)
moved = sqs.cancel_message_move_task(TaskHandle=paced)["ApproximateNumberOfMessagesMoved"]
cancelled = wait_task(arn(f"{prefix}-dlq2"), "CANCELLED")[0]
check(moved <= cancelled["ApproximateNumberOfMessagesMoved"] < 5, cancelled)

# ---- Queues deleted ----
# berth keeps a dead-letter queue while a queue's RedrivePolicy names it (SQS lets it go: docs/sqs.md).
fails("InvalidParameterValue", sqs.delete_queue, QueueUrl=dlq)
for q in [url, work, dlq, fifo, slow, work2, dlq2] + listed:
    sqs.delete_queue(QueueUrl=q)
fails("AWS.SimpleQueueService.NonExistentQueue", sqs.send_message, QueueUrl=url, MessageBody="gone")
print(f"ok: {protocol}")
