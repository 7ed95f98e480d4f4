#include "proto_client.h"
#include <stdio.h>
int main(void){ pc_conn c={0}; if(pc_open(&c,"tcp://127.0.0.1:17411",2000)){puts("open");return 1;}
 const char *keys[]={"default","a"};
 Allot__V1__Envelope *e=pc_register(&c,"r1","svc",keys,2,100);
 printf("e=%p\n",(void*)e); if(e){printf("case %d\n",e->body_case); if(e->body_case==ALLOT__V1__ENVELOPE__BODY_WELCOME) printf("cfg %zu\n", e->welcome->config.len); if(e->body_case==ALLOT__V1__ENVELOPE__BODY_ERROR) printf("%s\n",e->error->message);}
 return 0;}
